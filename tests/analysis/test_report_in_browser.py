"""The report as an operator sees it: rendered by Chromium at two history sizes (a few
providers; 100 rpcs over 80 providers) and two widths, every chart drawn and inside the
page, the findings first, nothing wider than the window. Screenshots are kept under
the test's tmp_path (``--basetemp`` to look at them)."""

import pytest

from rpcbus.analytics import analysis
from rpcbus.analytics.historygen import generate

from .conftest import PYSPARK_WARNINGS

pytestmark = PYSPARK_WARNINGS

LAYOUT = """(() => {
  const imgs = [...document.images];
  return {images: imgs.length,
          drawn: imgs.filter(i => i.naturalWidth > 300 && i.naturalHeight > 150).length,
          inside: imgs.every(i => i.getBoundingClientRect().right <= innerWidth + 1),
          scrollsSideways: document.documentElement.scrollWidth > innerWidth + 1,
          headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
          findings: document.querySelectorAll('ul li').length};
})()"""


@pytest.mark.parametrize("size", ["few", "large"])
@pytest.mark.timeout(600)
async def test_the_report_renders_whole_and_readable(spark, browser, tmp_path, size):
    history, out = tmp_path / "history", tmp_path / "out"
    if size == "few":
        generate(str(history), nodes=2, providers=4, rpcs=2, hours=0.5, seed=9,
                 slow=("p1",), starved=("p2",))
    else:
        generate(str(history), nodes=4, providers=80, rpcs=100, hours=0.25, window=60,
                 seed=4, slow=("p7", "p33@5-12"), failing=("p12",), hogs=("p50",))
    analysis.analyze(spark, str(history), str(out))
    page = (out / "report" / "report.html").as_uri()
    for width in (1280, 480):
        await browser.screenshot(page, width, 900, tmp_path / f"report-{size}-{width}.png")
        layout = await browser.value(LAYOUT)
        assert layout["images"] == layout["drawn"] == 4, layout
        assert layout["inside"] and not layout["scrollsSideways"], layout
        assert layout["headings"][0] == "Findings" and layout["findings"] >= 2, layout
        assert layout["headings"][-1] == "Recommended weights", layout
