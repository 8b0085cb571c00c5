#!/usr/bin/env bash
# Builds, once, a minimal OpenTelemetry Collector for the tracing e2e test (e2e/test_tracing.py):
# the collector core with the OTLP receiver (gRPC and HTTP) and the file exporter (OTLP JSON, one
# line per batch), nothing else, from the Go module proxy. Cached outside the work tree in a
# folder keyed by the version; a missing binary is rebuilt, a present one reused at once.
# Prints the binary's path on stdout (progress goes to stderr).
set -euo pipefail

# One collector release for every module: core v0.161.0 (its stable modules v1.67.0) and contrib's
# file exporter v0.161.0 (the newest one that resolves from the proxy with its dependencies).
OTELCOL_VERSION=${OTELCOL_VERSION:-v0.161.0}
OTELCOL_STABLE_VERSION=${OTELCOL_STABLE_VERSION:-v1.67.0}

CACHE_ROOT=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
DIR="$CACHE_ROOT/otelcol-$OTELCOL_VERSION"
BIN="$DIR/otelcol"

log() { echo "install-otelcol: $*" >&2; }

if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi

command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none found on PATH"; exit 1; }
export GOSUMDB=${GOSUMDB:-off} GOTOOLCHAIN=${GOTOOLCHAIN_OVERRIDE:-local} GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
cd "$work"
go mod init local/otelcolbuild >/dev/null 2>&1
printf 'package main\n\nconst version = "%s"\n' "$OTELCOL_VERSION" > version.go
# What the collector builder (ocb) would generate for these two components, by hand: its own
# telemetry is a logger on stderr only (the default telemetry factory pulls in every cloud's
# resource detectors, which this test does not need).
cat > main.go <<'EOF'
package main

import (
	"context"
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.uber.org/zap"
)

type telemetryConfig struct{}

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: telemetry.NewFactory(
		func() component.Config { return &telemetryConfig{} },
		telemetry.WithCreateLogger(func(context.Context, telemetry.LoggerSettings, component.Config) (*zap.Logger, component.ShutdownFunc, error) {
			logger, err := zap.NewProduction()
			return logger, nil, err
		}))}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
	return f, err
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "OTLP in, OTLP JSON file out", Version: version},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
				DefaultScheme:     "file",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
EOF
log "resolving the collector $OTELCOL_VERSION (otlp receiver, file exporter)"
go get "go.opentelemetry.io/collector/otelcol@$OTELCOL_VERSION" \
  "go.opentelemetry.io/collector/receiver/otlpreceiver@$OTELCOL_VERSION" \
  "go.opentelemetry.io/collector/service@$OTELCOL_VERSION" \
  "go.opentelemetry.io/collector/confmap/provider/fileprovider@$OTELCOL_STABLE_VERSION" \
  "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter@$OTELCOL_VERSION" >&2
go mod tidy >&2
log "building"
go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
log "collector ready in $BIN after $(( $(date +%s) - started ))s"
echo "$BIN"
