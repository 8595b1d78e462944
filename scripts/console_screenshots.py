"""Take the console screenshots of the documentation (docs/img/console-*.png).

Runs ``gateway-limiter demo --console`` (a temporary SQLite table, ``memory://``, live
traffic), opens the page in headless chromium through selenium, and saves the page
while the demo's callers are being admitted, made to wait and refused:

    .venv/bin/python scripts/console_screenshots.py

Needs the console and test extras (selenium) and Debian's chromium and chromedriver.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    port = free_port()
    command = ["demo", "--console", "--port", str(port), "--seconds", "60"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway_limiter", *command], stdout=subprocess.DEVNULL
    )
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    service = webdriver.ChromeService(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                driver.get(f"http://127.0.0.1:{port}/")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#rules tr[data-config-id]"))
        # the live table fills once the demo's callers have run a few seconds
        time.sleep(8)
        driver.save_screenshot(str(IMG / "console-live.png"))
        rules = driver.find_element(By.ID, "rules-section")
        driver.execute_script("arguments[0].scrollIntoView(true);", rules)
        driver.save_screenshot(str(IMG / "console-rules.png"))
    finally:
        driver.quit()
        demo.terminate()
        demo.wait(timeout=30)


if __name__ == "__main__":
    main()
