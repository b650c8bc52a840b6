#!/usr/bin/python3
"""Renders an `sdalloc replay --report` page in headless Chromium and checks the result.

    render-report-in-chromium.py --html REPORT.html [--expect TEXT]... [-- GENERATOR ARGS...]

Runs the generator command first when one is given (it must write REPORT.html), then opens
the page once in headless Chromium, which writes a screenshot and prints the DOM. Fails
(exit 1) unless:
  - the screenshot is a PNG of exactly the window size, and not blank (it has several
    colours and its rows differ);
  - Chromium logged no console message: the report runs no script and fetches nothing (its
    Content-Security-Policy turns a fetch into a console error), so any message is a fault;
  - the DOM holds the results table, at least one plot and every --expect text.
When Chromium is not installed it exits 77 (ctest SKIP_RETURN_CODE), or fails when the
environment variable CI is set, where a missing browser is a broken machine, not a choice.
Standard library only; runs as root (hence --no-sandbox). The screenshot and Chromium's log
stay in --out-dir (default: next to the report) for a person to look at.
"""

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

SKIP = 77
WINDOW = (1280, 2000)


def fail(message):
    print(f"render-report-in-chromium: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def png_pixels(data):
    """(width, height, rows) of an 8-bit RGB or RGBA PNG; rows are bytes without filters."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("the screenshot is not a PNG file")
    pos, chunks, header = 8, [], None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        fail("the screenshot has no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        fail(f"unexpected PNG format: depth {depth}, colour type {colour}, interlace {interlace}")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    if len(raw) != height * (stride + 1):
        fail(f"PNG data is {len(raw)} bytes, expected {height * (stride + 1)}")
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        elif kind != 0:
            fail(f"PNG row {y} has unknown filter {kind}")
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def check_screenshot(path):
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        fail(f"Chromium wrote no screenshot at {path}")
    with open(path, "rb") as f:
        width, height, channels, rows = png_pixels(f.read())
    if (width, height) != WINDOW:
        fail(f"screenshot is {width}x{height}, expected {WINDOW[0]}x{WINDOW[1]}")
    distinct_rows = len(set(rows))
    colours = set()
    for row in rows[::8]:
        for x in range(0, len(row), channels * 3):
            colours.add(row[x:x + 3])
    # A page with a table, plots and text has hundreds of distinct rows and many colours
    # (anti-aliasing alone gives dozens); a blank or failed page has one or two of each.
    if distinct_rows < 100 or len(colours) < 16:
        fail(f"screenshot looks blank: {distinct_rows} distinct rows, {len(colours)} colours")
    print(f"screenshot {path}: {width}x{height}, {distinct_rows} distinct rows, "
          f"{len(colours)}+ colours")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--html", required=True, help="the report to render")
    parser.add_argument("--out-dir", help="where the screenshot and log go")
    parser.add_argument("--expect", action="append", default=[],
                        help="text the rendered DOM must contain (repeatable)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for Chromium")
    parser.add_argument("generator", nargs="*", help="command that writes the report")
    args = parser.parse_args()
    started = time.monotonic()

    chromium = find_chromium()
    if chromium is None:
        message = "chromium is not installed (Debian package 'chromium', scripts/install-deps.sh)"
        if os.environ.get("CI"):
            fail(message + "; CI is set, so this is an error")
        print(f"render-report-in-chromium: SKIP: {message}")
        return SKIP

    html = os.path.abspath(args.html)
    out_dir = os.path.abspath(args.out_dir or os.path.dirname(html))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.dirname(html), exist_ok=True)
    if args.generator:
        if os.path.exists(html):
            os.remove(html)
        generated = subprocess.run(args.generator, check=False)
        if generated.returncode != 0:
            fail(f"the generator exited with {generated.returncode}: {' '.join(args.generator)}")
    if not os.path.isfile(html):
        fail(f"no report at {html}")

    screenshot = os.path.join(out_dir, "report.png")
    log_path = os.path.join(out_dir, "chromium.log")
    if os.path.exists(screenshot):
        os.remove(screenshot)
    with tempfile.TemporaryDirectory(prefix="sdalloc-chromium-") as profile:
        command = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
            # Nothing in the background: the machine may be offline, and startup is the cost.
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            "--disable-component-update", "--disable-default-apps", "--mute-audio",
            "--enable-logging=stderr", "--v=0",
            f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={screenshot}",
            "--dump-dom", "file://" + html,
        ]
        # No D-Bus in a container: tell Chromium not to look for one, to keep the log short.
        env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS="disabled:")
        chromium_started = time.monotonic()
        try:
            run = subprocess.run(command, capture_output=True, text=True, errors="replace",
                                 timeout=args.timeout, env=env, check=False)
        except subprocess.TimeoutExpired:
            fail(f"Chromium did not finish within {args.timeout:.0f} s: {' '.join(command)}")
    chromium_seconds = time.monotonic() - chromium_started
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n" + run.stderr)
    if run.returncode != 0:
        fail(f"Chromium exited with {run.returncode}; its log: {log_path}")

    console = [line for line in run.stderr.splitlines()
               if ":CONSOLE" in line or "Uncaught" in line]
    if console:
        fail("the page logged to the console:\n  " + "\n  ".join(console))

    dom = run.stdout
    for needed in ['<table class="results">', "<svg", '<table class="histogram">',
                   *args.expect]:
        if needed not in dom:
            fail(f"the rendered DOM lacks {needed!r} (DOM: {len(dom)} characters)")

    check_screenshot(screenshot)
    print(f"render-report-in-chromium: OK in {time.monotonic() - started:.1f} s, "
          f"{chromium_seconds:.1f} s of them in Chromium "
          f"({os.path.getsize(html)} bytes of HTML; log {log_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
