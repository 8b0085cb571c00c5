-- Argo CD health check for serving.triton-operator.io/InferenceService.
-- Install it under resource.customizations.health.serving.triton-operator.io_InferenceService in
-- the argocd-cm ConfigMap (see docs/gitops.md). It reads only status the operator writes.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
local generation = obj.metadata.generation
if obj.status.observedGeneration ~= nil and generation ~= nil and obj.status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on generation " .. generation
  return hs
end
local ready, degraded, progressing
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then ready = c
  elseif c.type == "Degraded" then degraded = c
  elseif c.type == "Progressing" then progressing = c end
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.reason .. ": " .. (degraded.message or "")
  return hs
end
if ready ~= nil and ready.status == "True" then
  if progressing ~= nil and progressing.status == "True" then
    hs.status = "Progressing"
    hs.message = progressing.message or "Scaling"
  else
    hs.status = "Healthy"
    hs.message = ready.message or "Ready"
  end
  return hs
end
if ready ~= nil and ready.reason == "ScaledToZero" then
  hs.status = "Suspended"
  hs.message = ready.message or "Scaled to zero"
  return hs
end
hs.status = "Progressing"
hs.message = (ready and (ready.reason .. ": " .. (ready.message or ""))) or "Not ready yet"
return hs
