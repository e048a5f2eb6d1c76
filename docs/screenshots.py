"""The README's pictures of the web console, taken from the sample network.

Starts paris, lyon and tokyo (``conf/network/``, their fixed ports: nothing else may use
them) as ``martinet run`` processes in a temporary folder, sends a few hundred messages and
then a steady flow, so that queues and links have something to show, and saves what Debian's chromium (through
chromium-driver and Selenium, as the browser tests drive it) renders of the map and of a
queue's page into ``docs/images/``:

    .venv/bin/python docs/screenshots.py

(proton and Selenium come with the ``test`` extra.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from proton import Message
from proton.utils import BlockingConnection
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

TOP = Path(__file__).resolve().parent.parent
IMAGES = TOP / "docs" / "images"
ROUTERS = {"paris": (5681, 8081), "lyon": (5682, 8082), "tokyo": (5683, 8083)}


def wait_for(url: str, text: str, timeout: float = 60) -> None:
    """Until the page at ``url`` holds ``text`` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as page:
                if text in page.read().decode():
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"screenshots: {url} did not show {text!r} within {timeout:g} s")


def send(port: int, address: str, count: int, pause: float = 0.0, stop: threading.Event | None = None) -> None:
    connection = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
    sender = connection.create_sender(address)
    for n in range(count):
        if stop is not None and stop.is_set():
            break
        sender.send(Message(body=f"order {n}", durable=True, properties={"region": ("eu", "asia")[n % 2]}))
        time.sleep(pause)
    connection.close()


def main() -> int:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        print("screenshots: needs Debian's chromium and chromium-driver", file=sys.stderr)
        return 1
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="martinet-screenshots-") as folder:
        processes = []
        try:
            for name in ROUTERS:
                cwd = Path(folder) / name
                cwd.mkdir()
                log = (cwd / "log").open("w")
                command = [
                    sys.executable,
                    "-m",
                    "martinet.kernel",
                    "run",
                    str(TOP / "conf" / "network" / f"{name}.xml"),
                ]
                processes.append(subprocess.Popen(command, cwd=cwd, stdout=log, stderr=log))
            for name, (_, web) in ROUTERS.items():  # every router knows the other two
                for other in ROUTERS:
                    if other != name:
                        wait_for(f"http://127.0.0.1:{web}/routers/{name}", f"rt${other}")
            send(ROUTERS["tokyo"][0], "orders@paris", 300)  # routed over the network
            send(ROUTERS["paris"][0], "invoices", 120)
            stop = threading.Event()
            # a steady flow meanwhile, so that the links' labels have rates
            flows = [
                threading.Thread(target=send, args=(ROUTERS[source][0], address, 10_000, 0.03, stop))
                for source, address in (("tokyo", "orders@paris"), ("lyon", "invoices@paris"), ("paris", "audit@tokyo"))
            ]
            for flow in flows:
                flow.start()
            wait_for(f"http://127.0.0.1:{ROUTERS['paris'][1]}/routers/paris/queues", "orders")
            options = webdriver.ChromeOptions()
            options.binary_location = chromium
            for argument in ("--headless=new", "--no-sandbox", "--disable-gpu"):
                options.add_argument(argument)
            browser = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
            try:
                time.sleep(22)  # two crawls and 10 s rate samples: the map's labels have figures
                for page, image, height in (
                    ("/", "console-map.png", 800),
                    ("/routers/paris/queues/orders", "console-queue.png", 1500),
                ):
                    browser.set_window_size(1100, height)
                    browser.get(f"http://127.0.0.1:{ROUTERS['paris'][1]}{page}")
                    time.sleep(2)  # the map's script draws after the first event
                    browser.save_screenshot(str(IMAGES / image))
                    print(f"screenshots: {IMAGES / image}")
            finally:
                browser.quit()
                stop.set()
                for flow in flows:
                    flow.join()
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
