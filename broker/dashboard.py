"""``GET /dashboard``: one static page (broker/dashboard.html: HTML, CSS and JavaScript,
no build step, no external resources) that polls ``GET /cluster`` once a second."""

from pathlib import Path

PAGE = (Path(__file__).with_name("dashboard.html")).read_text(encoding="utf-8")
