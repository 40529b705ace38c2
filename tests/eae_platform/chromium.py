"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for page tests:
navigate, evaluate JavaScript, wait for a condition, take a screenshot. A minimal client on
`websockets` (pinned in the test extra); scripts/bootstrap installs chromium when missing."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("chromium not found: run scripts/bootstrap (it installs Debian's chromium)")


class Browser:
    def __init__(self, width: int = 1200, height: int = 900, timeout: float = 60.0):
        self.profile = tempfile.mkdtemp(prefix="eae-chromium-")
        cmd = [
            chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-extensions", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}", "about:blank",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(port_file.read_text().split("\n")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        from websockets.sync.client import connect  # here: the GPU machines, which run test_serve.py, lack it

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=2**26, open_timeout=timeout)
        self._ids = itertools.count(1)

    def send(self, method: str, **params) -> dict:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=120))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str, timeout: float = 90.0) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", timeout)

    def wait_for(self, condition: str, timeout: float = 90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(condition)
            if value:
                return value
            time.sleep(0.1)
        body = self.evaluate("document.body ? document.body.innerText.slice(0, 500) : ''")
        raise TimeoutError(f"waited {timeout} s for {condition}; the page shows: {body!r}")

    def screenshot(self, path: str | Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)
