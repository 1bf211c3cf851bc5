"""The screenshots in docs/images/ (docs/viewer.md): the real server over a corpus, headless chromium.

    python -m tests.viewer.screenshots CORPUS RUN_ID/TASK_ID [OUT_DIR]

Each PNG is reduced to a 256-colour palette, which keeps text sharp at a fraction of the size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.helpers import REPO, free_port


def shoot(corpus: str, task: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", "--corpus", corpus, "--port", str(port)],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,860", "--hide-scrollbars"):
        options.add_argument(arg)
    written = []
    try:
        for _ in range(150):
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            shots = [("viewer-tasks.png", "/tasks?domain=calendar", None),
                     ("viewer-task.png", f"/tasks/{task}", None),
                     ("viewer-task-calls.png", f"/tasks/{task}", "reference-heading"),
                     ("viewer-task-verdicts.png", f"/tasks/{task}", "controls-heading"),
                     ("viewer-plots.png", "/plots", None)]
            for name, path, element in shots:
                driver.get(url + path)
                target = out / name
                if element:
                    driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", element)
                driver.save_screenshot(str(target))
                Image.open(target).convert("RGB").quantize(256).save(target, optimize=True)
                written.append(target)
        finally:
            driver.quit()
    finally:
        server.terminate()
        server.wait(timeout=20)
    return written


if __name__ == "__main__":
    for path in shoot(sys.argv[1], sys.argv[2], Path(sys.argv[3] if len(sys.argv) > 3 else "docs/images")):
        print(path, path.stat().st_size)
