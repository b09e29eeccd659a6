"""A real Prometheus for tests: Debian's ``/usr/bin/prometheus`` on loopback, scraping static
targets with the labels the chart's monitors attach, optionally evaluating rule files.

    p = Prometheus(work_dir, [Target("127.0.0.1:8000", {"namespace": "ns", ...})])
    p.query("up"); p.alerts(); p.stop()
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from spyre_engine.testing.process import free_port

BINARY = Path(shutil.which("prometheus") or "/usr/bin/prometheus")

#: The chart's PodMonitor copies these pod labels; Prometheus names them like this.
MODEL_LABEL = "serving_spyre_dev_model"


@dataclass
class Target:
    address: str
    labels: dict[str, str] = field(default_factory=dict)


def available() -> bool:
    return BINARY.exists()


class Prometheus:
    """One Prometheus process; ``honor_labels`` as the chart's monitors set it."""

    def __init__(self, directory: Path, targets: list[Target], interval: str = "1s",
                 rule_groups: list[dict[str, Any]] | None = None, ready_timeout: float = 60):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": "spyre",
                "honor_labels": True,
                "static_configs": [{"targets": [t.address], "labels": t.labels}
                                   for t in targets],
            }],
        }
        if rule_groups is not None:
            (self.dir / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
            config["rule_files"] = [str(self.dir / "rules.yaml")]
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(self.dir / "prometheus.log", "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [str(BINARY), f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + ready_timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("Prometheus did not start: "
                                   + (self.dir / "prometheus.log").read_text()[-2000:])
            time.sleep(0.3)

    def api(self, path: str, **params: Any) -> Any:
        """``/api/v1/<path>``'s data; a failed query raises with Prometheus' error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{path} {params}: HTTP {e.code}: {e.read()[:500]!r}") from None
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]  # type: ignore[no-any-return]

    def series(self, name: str) -> list[dict[str, str]]:
        return self.api("series", **{"match[]": name})  # type: ignore[no-any-return]

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
