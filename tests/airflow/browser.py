"""A real browser on a running Airflow's UI: Debian's Chromium (installed by bootstrap.sh) driven
by Playwright's sync API (Playwright cannot download its own browsers on a closed network).

:class:`UI` is what a user does with the mouse and keyboard: log in on the login page, open a
DAG's Trigger form, pick options from its dropdowns, type into its fields. Screenshots go to
``$DBLOG_TEST_ARTIFACTS`` or ``<repo>/.artifacts/browser/``, named by test and step.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# headless as root; without the background-networking flags Chromium's own connections to
# Google's hosts are refused by the closed network, many at a time
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 60_000  # every wait in the page: a loaded 2-core machine runs Airflow and Spark too
VIEWPORT = {"width": 1400, "height": 1600}  # tall enough for the whole Trigger form in a screenshot


def artifacts_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / ".artifacts" / "browser"
    path = Path(os.environ.get("DBLOG_TEST_ARTIFACTS") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch(playwright):
    """Debian's Chromium, headless; a missing one fails the test (never skips: CI must run it)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make bootstrap` (it installs Debian's chromium)",
                    pytrace=False)
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class UI:
    """One user's browser tab on the Airflow at ``url``; ``name`` prefixes its screenshots."""

    def __init__(self, page, url: str, name: str):
        self.page, self.url, self.name = page, url, name
        self.steps = 0
        page.set_default_timeout(TIMEOUT_MS)

    def shot(self, step: str) -> Path:
        """A screenshot of the page as it is now: ``<test>-<n>-<step>.png``."""
        self.steps += 1
        path = artifacts_dir() / f"{self.name}-{self.steps:02d}-{step}.png"
        self.page.screenshot(path=str(path))
        return path

    def save_failure(self) -> None:
        """The page as the test left it (screenshot and HTML), for a failed test."""
        out = artifacts_dir()
        self.page.screenshot(path=str(out / f"{self.name}-FAILED.png"))
        (out / f"{self.name}-FAILED.html").write_text(self.page.content())

    def login(self, user: str, password: str, path: str = "/") -> None:
        """Open ``path``; Airflow sends the browser to its login page first (SimpleAuthManager's
        form), then back to ``path``."""
        page = self.page
        page.goto(self.url + path)
        page.get_by_label("Username").fill(user)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/auth/login" not in url)

    def open_trigger_form(self, dag_id: str):
        """The DAG's page, its Trigger button: the form (a dialog), once its fields are shown."""
        self.page.goto(f"{self.url}/dags/{dag_id}")
        self.page.get_by_role("button", name="Trigger Dag").click()
        form = self.page.get_by_role("dialog")
        form.get_by_text("Run Parameters").wait_for()
        return form

    def choose(self, form, label: str, option: str) -> None:
        """Pick ``option`` in the form's dropdown ``label`` (a react-select combobox)."""
        form.get_by_role("combobox", name=label, exact=True).click()
        self.page.get_by_role("option", name=option, exact=True).click()

    @staticmethod
    def field(form, param: str):
        """A text field of the form by its param's name (the UI names it ``element_<param>``;
        its label is not tied to a textarea)."""
        return form.locator(f"[name=element_{param}]")

    @staticmethod
    def switch(form, param: str):
        """A boolean param's switch by its param's name: the label around its hidden checkbox
        (``element_<param>``), what a click toggles."""
        return form.locator(f"label:has(input[name=element_{param}])")

    @staticmethod
    def trigger_button(form):
        return form.get_by_role("button", name="Trigger", exact=True)
