"""
Look at a run's Snakemake report as a reader does: open it in headless Chromium, go to
a result (the figure, the metrics table, ...) the way a reader clicks there, and save
a screenshot of each.

    snakemake --report report.html
    python benchmarks/report_screenshot.py report.html --out screenshots/

Writes ``<out>/<category>-<label>.png`` for the figure ("Figure" / "Fig. 4D-E") and the
Stage 5 table ("Stage 5" / "alignment A_k per pair"), and prints their paths. Needs a
Chromium (``chromium``, ``chromium-browser`` or ``google-chrome`` on PATH; Debian:
``apt-get install chromium``); without one it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: (category, label of the result in that category) to show.
VIEWS = (("Figure", "Fig. 4D-E"), ("Stage 5", "alignment A_k per pair"))

# Clicks the category in the menu, then the eye button of the result (React handlers
# listen to bubbling clicks).
CLICK = """<script>
function leaf(t){return [...document.querySelectorAll('*')].filter(
  e=>e.children.length===0&&e.textContent.trim()===t)[0]}
function click(e){e.dispatchEvent(new MouseEvent('click',{bubbles:true}))}
setTimeout(()=>click(leaf(%s)),300);
setTimeout(()=>{let row=leaf(%s).parentElement;
  for(let i=0;i<3&&!row.querySelector('svg,a,button');i++)row=row.parentElement;
  click(row.querySelector('svg,a,button'));},900);
</script>"""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    return None


def screenshot(report: Path, category: str, label: str, out: Path, browser: str):
    html = report.read_text()
    end = html.rfind("</body>")
    script = CLICK % (json.dumps(category), json.dumps(label))
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp, "report.html")
        page.write_text(html[:end] + script + html[end:])
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1600,900",
                "--virtual-time-budget=4000",
                f"--screenshot={out}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--out", type=Path, default=Path("report-screenshots"))
    args = parser.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("no Chromium on PATH (apt-get install chromium): no screenshot taken")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for category, label in VIEWS:
        name = f"{category}-{label}".replace(" ", "_").replace("/", "_")
        out = args.out / f"{name}.png"
        screenshot(args.report, category, label, out, browser)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
