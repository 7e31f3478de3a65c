"""The harness node's registries (plain, and with htpasswd for releases) and the test images
pushed to the plain one."""

from __future__ import annotations

import secrets
import time
import urllib.error
import urllib.request

from tests.framework import oci, registry
from tests.framework.nodelayout import REGISTRY_BIN, NodeLayout, _http_ok, _wait, log
from tests.framework.procs import HarnessError, free_port, spawn


class NodeRegistry(NodeLayout):
    def _start_registry(self) -> None:
        proc = self.proc("registry")
        if proc.alive() and self.info.registry_host:
            return
        port = free_port(self.bind)
        d = self.dir / "registry"
        (d / "storage").mkdir(parents=True, exist_ok=True)
        cfg = d / "config.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {d / 'storage'}\n"
            "  delete:\n    enabled: true\n  redirect:\n    disable: true\n"
            f"http:\n  addr: {self.bind}:{port}\n")
        proc = spawn("node-registry", [REGISTRY_BIN, "serve", str(cfg)], self.cp.state)
        self.info.registry_host = f"{self.bind}:{port}"
        self._save()
        _wait(lambda: _http_ok(f"http://{self.info.registry_host}/v2/"), 20,
              "docker-registry", proc)

    def _start_auth_registry(self) -> None:
        """The registry a release is pushed to: credentials required to push and pull,
        a password of this run's own (node.json, in the state directory)."""
        proc = self.proc("authregistry")
        if proc.alive() and self.info.auth_registry_host:
            return
        port = free_port(self.bind)
        d = self.dir / "authregistry"
        (d / "storage").mkdir(parents=True, exist_ok=True)
        user, password = "aggapi-release", secrets.token_urlsafe(18)
        registry.write_htpasswd(d / "htpasswd", user, password)
        cfg = d / "config.yml"
        cfg.write_text(registry.config_yaml(d / "storage", f"{self.bind}:{port}",
                                            htpasswd=d / "htpasswd"))
        proc = spawn("node-authregistry", [REGISTRY_BIN, "serve", str(cfg)], self.cp.state)
        self.info.auth_registry_host = f"{self.bind}:{port}"
        self.info.auth_registry_user, self.info.auth_registry_password = user, password
        self._save()
        _wait(lambda: registry.registry_answers(self.info.auth_registry_host), 20,
              "docker-registry (htpasswd)", proc)

    def _push_images(self) -> None:
        cache = oci.BlobCache(self.cache_dir)
        host = self.info.registry_host
        pause = oci.pause_image(cache)
        oci.push_image(host, "aggapi-test/pause", pause, "1")
        oci.push_image(host, "aggapi-test/busybox", oci.busybox_image(cache), "1")
        oci.push_image(host, "aggapi-test/noshell", oci.no_shell_image(cache), "1")
        t0 = time.monotonic()
        layers = [cache.busybox_layer()] + [
            cache.random_layer(n, seed=f"big-{i}")
            for i, n in enumerate((self.big_layer // 2, self.big_layer // 3,
                                   self.big_layer // 6))]
        big = oci.build_image(layers, cmd=["/bin/busybox", "sleep", "3600"],
                              labels={"io.aggapi.test": "big"})
        if time.monotonic() - t0 > 5:
            log(f"built the big image's layers in {time.monotonic() - t0:.0f}s "
                f"(cached in {self.cache_dir})")
        oci.push_image(host, "aggapi-test/big", big, "1")
        self.info.images = {
            "pause": f"{host}/aggapi-test/pause:1",
            "busybox": f"{host}/aggapi-test/busybox:1",
            "noshell": f"{host}/aggapi-test/noshell:1",
            "big": "aggapi-test/big:1",
            "big_layers": [(la.blob.digest, la.blob.size) for la in big.layers],
        }
        self.info.sandbox_image = self.info.images["pause"]
        self._save()

    def tag(self, repo_tag: str, new_tag: str) -> str:
        """Give an image in the registry another tag (its manifest again; no blobs move).

        A fresh name for the same bytes: ``tag(images.big, "demo-2")`` is pulled like
        a new image once the old one is removed. Returns ``repository:new_tag``."""
        repo, _, tag = repo_tag.partition(":")
        base = f"http://{self.info.registry_host}/v2/{repo}/manifests"
        req = urllib.request.Request(f"{base}/{tag}", headers={"Accept": oci.MEDIA_MANIFEST})
        with urllib.request.urlopen(req, timeout=10) as r:
            body, media = r.read(), r.headers.get("Content-Type", oci.MEDIA_MANIFEST)
        put = urllib.request.Request(f"{base}/{new_tag}", data=body, method="PUT",
                                     headers={"Content-Type": media})
        with urllib.request.urlopen(put, timeout=10) as r:
            if r.status != 201:
                raise HarnessError(f"tag {repo}:{new_tag}: HTTP {r.status}")
        return f"{repo}:{new_tag}"
