"""The asyncio face of the informer: LIST and WATCH with aiohttp, one kind in one namespace, on the
caller's event loop, following `watching`'s protocol as the threaded `informer` does (list in
pages, watch from the list's resourceVersion with bookmarks, an expired watch (410 Gone) lists
again, failures retried with a doubling pause). The gateway routes from it, so that its routing
table is updated on the loop that reads it, without locks, and no request to the gateway ever
reads the API server. Credentials come from the kubernetes library's loaders (in-cluster
ServiceAccount token, refreshed as it rotates, or a kubeconfig), as `client.load_config`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any, AsyncIterator, Callable

import aiohttp
from kubernetes import client

from .kinds import Kind
from .watching import GONE, WATCH_SECONDS, Retry, WatchFailed, list_query, page_end, read_event, watch_query

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class ApiServer:
    """LIST and WATCH against the API server with aiohttp."""

    def __init__(self, configuration: client.Configuration):
        self.configuration = configuration
        self.host = configuration.host.rstrip("/")
        self.ssl: ssl.SSLContext | bool = False
        if self.host.startswith("https"):
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self.ssl = context
        self.session: aiohttp.ClientSession | None = None
        self.requests = 0

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "triton-operator-gateway"}
        # The kubernetes library keeps the token under BearerToken (newer) or authorization; its
        # refresh hook (in-cluster, rotating ServiceAccount tokens) runs on every read.
        token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        return headers

    async def _session(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl))
        return self.session

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def list(self, path: str, selector: str | None) -> tuple[list[dict[str, Any]], str]:
        session = await self._session()
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            params = list_query(selector, None, token)
            self.requests += 1
            async with session.get(self.host + path, params=params, headers=self._headers(),
                                   timeout=aiohttp.ClientTimeout(total=60)) as resp:
                if resp.status != 200:
                    raise ApiError(resp.status, (await resp.text())[:300])
                page = await resp.json()
            items.extend(page.get("items") or [])
            token, version = page_end(page)
            if not token:
                return items, version

    async def watch(self, path: str, version: str, selector: str | None, timeout: int
                    ) -> AsyncIterator[dict[str, Any]]:
        session = await self._session()
        params = watch_query(version, selector, None, timeout)
        self.requests += 1
        async with session.get(self.host + path, params=params, headers=self._headers(),
                               timeout=aiohttp.ClientTimeout(total=timeout + 30, sock_connect=10)) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, (await resp.text())[:300])
            # Chunks, not readline(): one event (a large EndpointSlice) may exceed aiohttp's line limit.
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)


class Watch:
    """One kind in one namespace (or all): `on_list(items)` after every listing, `on_event(type,
    obj)` per watch event. `synced` is set once the first listing is in."""

    def __init__(self, api: ApiServer, kind: Kind, namespace: str | None,
                 on_list: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None],
                 selector: str | None = None, timeout: int = WATCH_SECONDS):
        self.api, self.selector, self.timeout = api, selector, timeout
        self.path = kind.path(namespace)
        self.name = kind.plural + (f" in {namespace}" if namespace else "")
        self.on_list, self.on_event = on_list, on_event
        self.synced = asyncio.Event()
        self.failing: str | None = None

    async def run(self) -> None:
        version: str | None = None
        retry = Retry()
        while True:
            try:
                if version is None:
                    items, version = await self.api.list(self.path, self.selector)
                    self.on_list(items)
                    self.synced.set()
                async for event in self.api.watch(self.path, version, self.selector, self.timeout):
                    version, change, obj = read_event(event, version)
                    if version is None:
                        break  # expired: list again
                    if change is not None:
                        self.on_event(change, obj)
                if self.failing:
                    log.info("watching %s again", self.name)
                self.failing = None
                retry.succeeded()
            except asyncio.CancelledError:
                raise
            except WatchFailed as e:
                await self._failed(f"{e.status}: {e.message}", retry.failed())
            except ApiError as e:
                if e.status == GONE:
                    version = None
                    continue
                await self._failed(str(e), retry.failed())
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as e:
                await self._failed(f"{type(e).__name__}: {e}"[:300], retry.failed())

    async def _failed(self, why: str, delay: float) -> None:
        if self.failing != why:
            log.warning("watching %s failed (%s); retrying", self.name, why)
        self.failing = why
        await asyncio.sleep(delay)
