"""The operator console in Debian's chromium, driven by playwright, against a live deprov.

Started by crates/deprov/tests/api/console.rs (`console_in_chromium`), which starts deprov with a
real PostgreSQL and a worker deleting tenant `big` at a paced rate, and a job for tenant `stuck`
that failed. Every check reads the page as a person sees it, and what changed is checked again
through the JSON API. The tests run in order (each continues from the state the previous left)
and stop at the first failure. Screenshots (1280x800) go to DEPROV_SCREENSHOTS.
"""

import json
import os
import sys
import time
import traceback
import urllib.parse
import urllib.request

from playwright.sync_api import expect, sync_playwright

URL = os.environ["DEPROV_URL"]
OPERATOR = os.environ["DEPROV_CONSOLE_OPERATOR"]
READONLY = os.environ["DEPROV_CONSOLE_READONLY"]
API_TOKEN = os.environ["DEPROV_API_TOKEN"]
BIG = os.environ["DEPROV_BIG_JOB"]
STUCK = os.environ["DEPROV_STUCK_JOB"]
SHOTS = os.environ["DEPROV_SCREENSHOTS"]
CHROMIUM = os.environ.get("DEPROV_CHROMIUM", "/usr/bin/chromium")
WORKERS = int(os.environ["DEPROV_WORKERS"])
DEADLINE_S = 30

expect.set_options(timeout=DEADLINE_S * 1000)


def api(path):
    """GET a JSON API route with the bootstrap operator token."""
    request = urllib.request.Request(URL + path, headers={"Authorization": "Bearer " + API_TOKEN})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def until(what, read, pred):
    """Polls read() until pred(value) holds, for at most DEADLINE_S seconds."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = read()
        if pred(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {value!r}")
        time.sleep(0.1)


def shot(page, name):
    page.screenshot(path=os.path.join(SHOTS, name + ".png"))


def login(page, token):
    page.goto(URL + "/ui/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page).to_have_url(URL + "/ui/kill-switches")


class Console:
    def __init__(self, browser):
        self.browser = browser
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.page = self.context.new_page()

    def test_login_sets_a_strict_session_cookie_and_shows_no_token(self):
        page = self.page
        response = page.goto(URL + "/ui/login")
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
        assert response.headers["x-frame-options"] == "DENY"
        shot(page, "login")
        page.fill("#token", "dpv_wrong-token-0123456789")
        page.click("button[type=submit]")
        expect(page.locator(".error")).to_contain_text("not a valid operator token")
        assert self.context.cookies() == []
        login(page, OPERATOR)
        cookies = self.context.cookies()
        assert len(cookies) == 1, cookies
        c = cookies[0]
        assert c["name"] == "deprov_console" and c["httpOnly"] and c["secure"], c
        assert c["sameSite"] == "Strict" and c["path"] == "/ui", c
        assert 7 * 3600 < c["expires"] - time.time() <= 8 * 3600 + 60, c
        expect(page.locator("#actor")).to_have_text("alice")
        expect(page.locator("#role")).to_have_text("operator")
        html = page.content()
        assert OPERATOR not in html and API_TOKEN not in html and c["value"] not in html

    def test_a_running_job_advances_without_a_reload(self):
        page = self.page
        page.goto(URL + "/ui/jobs")
        row = page.locator(f'tr[data-job="{BIG}"]')
        expect(row).to_have_attribute("data-state", "running")
        first = int(row.locator("td.rows").inner_text())
        page.evaluate("window.notReloaded = true")
        until("the row count to grow on the page", lambda: int(row.locator("td.rows").inner_text()),
              lambda n: n > first)
        assert page.evaluate("window.notReloaded") is True, "the page reloaded"
        shot(page, "jobs")
        page.goto(URL + f"/ui/jobs/{BIG}")
        rows = page.locator("#rows")
        first = int(rows.inner_text())
        until("the job page's row count to grow", lambda: int(rows.inner_text()), lambda n: n > first)
        expect(page.locator("#progress")).to_contain_text('"app"."items"')
        expect(page.locator("#requests")).to_contain_text("evt-big")
        shot(page, "job")

    def test_cancel_asks_for_confirmation_with_count_and_consequence(self):
        page = self.page
        page.goto(URL + f"/ui/jobs/{BIG}")
        page.click('#job-actions button[value="cancel"]')
        expect(page.locator("h1")).to_have_text("Confirm: cancel 1 job(s)")
        expect(page.locator("#consequence")).to_contain_text("what it already deleted stays deleted")
        expect(page.locator(f'#actions tr[data-job="{BIG}"]')).to_be_visible()
        shot(page, "confirm")
        page.click("text=Back to jobs (nothing changed)")
        assert api(f"/v1/jobs/{BIG}")["state"] in ("running", "queued"), "the confirmation changed the job"

    def test_the_global_kill_switch_is_acknowledged_by_every_worker_and_holds_the_job(self):
        page = self.page
        page.goto(URL + "/ui/kill-switches")
        page.fill("#global-reason", "incident: target saturated")
        page.click('#global-form button[value="true"]')
        expect(page.locator("#changed")).to_contain_text("global engaged")
        expect(page.locator("#global-state")).to_have_attribute("data-engaged", "true")
        version = api("/v1/kill-switch")["version"]
        # The live part shows every worker's acknowledgement and the verdict without a reload.
        expect(page.locator("#ack-state")).to_have_attribute("data-acknowledged", "true")
        workers = page.locator("tr[data-worker]")
        assert workers.count() == WORKERS, workers.count()
        expect(page.locator("#workers")).to_contain_text("listening (NOTIFY)")
        expect(page.locator("#workers")).to_contain_text("heartbeat only")
        for i in range(workers.count()):
            assert int(workers.nth(i).get_attribute("data-observed")) >= version
        status = api("/v1/kill-switch")
        assert status["acknowledged"] and len(status["live_workers"]) == workers.count(), status
        expect(page.locator('tr[data-scope="global"] [data-effect="in-effect"]')).to_be_visible()
        shot(page, "kill-switches")
        page.goto(URL + f"/ui/jobs/{BIG}")
        expect(page.locator("#state")).to_have_text("held")
        assert api(f"/v1/jobs/{BIG}")["state"] == "held"

    def test_releasing_it_resumes_the_job(self):
        page = self.page
        page.goto(URL + "/ui/kill-switches")
        page.fill("#global-reason", "incident over")
        page.click('#global-form button[value="false"]')
        expect(page.locator("#global-state")).to_have_attribute("data-engaged", "false")
        expect(page.locator("#ack-state")).to_have_attribute("data-acknowledged", "true")
        assert api("/v1/kill-switch")["engaged"] is False
        until("the job to leave held", lambda: api(f"/v1/jobs/{BIG}")["state"], lambda s: s != "held")

    def test_reconcile_dry_run_then_apply(self):
        page = self.page
        page.goto(URL + "/ui/reconcile")
        expect(page.locator(f'#failed tr[data-job="{STUCK}"]')).to_be_visible()
        shot(page, "reconcile")
        page.fill("#reason", "retry after the incident")
        page.click("#dry-run button[type=submit]")
        expect(page.locator("h1")).to_contain_text("Dry run")
        expect(page.locator(f'#diff tr[data-job="{STUCK}"][data-action="retry"]')).to_contain_text("failed")
        assert api(f"/v1/jobs/{STUCK}")["state"] == "failed", "the dry run changed something"
        shot(page, "reconcile-dry-run")
        page.fill("#rate", "5")
        page.click("#apply button[type=submit]")
        expect(page.locator("#applied")).to_contain_text("5 job(s) per second")
        expect(page.locator(f'#diff tr[data-job="{STUCK}"][data-action="retry"]')).to_be_visible()
        entries = api("/v1/audit?action=job.retry")["entries"]
        assert any(e["actor"] == "alice" and e["target"] == f"job:{STUCK}" for e in entries), entries
        shot(page, "reconcile-applied")

    def test_the_audit_log_shows_actor_and_reason(self):
        page = self.page
        page.goto(URL + "/ui/audit")
        for action, reason in [("kill_switch.engage", "incident: target saturated"),
                               ("kill_switch.release", "incident over"),
                               ("job.retry", "retry after the incident")]:
            expect(page.locator(f'tr[data-action="{action}"][data-actor="alice"]').first).to_contain_text(reason)
        shot(page, "audit")

    def test_a_forged_form_without_the_csrf_token_is_refused(self):
        page = self.page
        before = len(api("/v1/audit")["entries"])
        response = page.request.post(URL + "/ui/kill-switches",
                                     form={"scope": "global", "engaged": "true", "reason": "forged"})
        assert response.status == 403, response.status
        # The same as a form in the page, submitted by the browser.
        page.goto(URL + "/ui/kill-switches")
        with page.expect_navigation() as navigation:
            page.evaluate("""() => {
                const f = document.createElement("form");
                f.method = "post"; f.action = "/ui/kill-switches";
                for (const [k, v] of [["scope", "global"], ["engaged", "true"], ["reason", "forged"]]) {
                    const i = document.createElement("input"); i.type = "hidden"; i.name = k; i.value = v;
                    f.appendChild(i);
                }
                document.body.appendChild(f); f.submit();
            }""")
        assert navigation.value.status == 403
        expect(page.locator("body")).to_contain_text("CSRF")
        assert api("/v1/kill-switch")["engaged"] is False
        assert len(api("/v1/audit")["entries"]) == before

    def test_read_only_sees_everything_and_changes_nothing(self):
        context = self.browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        login(page, READONLY)
        expect(page.locator("#role")).to_have_text("read-only")
        expect(page.locator(".banner.readonly")).to_be_visible()
        expect(page.locator("#switches")).to_be_visible()
        assert page.locator("#global-form, #scoped-form").count() == 0
        shot(page, "read-only")
        for path, forms in [("/ui/jobs", "#bulk"), (f"/ui/jobs/{BIG}", "#job-actions"),
                            ("/ui/reconcile", "#dry-run"), ("/ui/audit", "form[method=post]:not(.inline)")]:
            page.goto(URL + path)
            expect(page.locator("main")).to_be_visible()
            assert page.locator(forms).count() == 0, path
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        before = len(api("/v1/audit")["entries"])
        for path, form in [("/ui/kill-switches", {"scope": "global", "engaged": "true", "reason": "ro"}),
                           ("/ui/reconcile/apply", {"retry": "true", "reason": "ro"}),
                           ("/ui/jobs/act", {"action": "cancel", "ids": BIG, "reason": "ro"})]:
            form["csrf"] = csrf
            response = page.request.post(URL + path, form=form)
            assert response.status == 403, (path, response.status)
        assert api("/v1/kill-switch")["engaged"] is False
        assert api(f"/v1/jobs/{BIG}")["state"] != "cancelled"
        assert len(api("/v1/audit")["entries"]) == before
        context.close()

    def test_logout_ends_the_session(self):
        page = self.page
        page.goto(URL + "/ui/jobs")
        page.click("text=Log out")
        expect(page).to_have_url(URL + "/ui/login")
        page.goto(URL + "/ui/jobs")
        expect(page).to_have_url(URL + "/ui/login")


def main():
    passed, failed = 0, 0
    started = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        console = Console(browser)
        tests = [name for name in Console.__dict__ if name.startswith("test_")]
        for name in tests:
            t0 = time.monotonic()
            try:
                getattr(console, name)()
            except Exception:
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - t0:.1f} s)")
                traceback.print_exc(file=sys.stdout)
                try:
                    print("page:", console.page.url)
                    print(console.page.inner_text("body")[:3000])
                except Exception:
                    pass
                break
            passed += 1
            print(f"PASS {name} ({time.monotonic() - t0:.1f} s)")
        browser.close()
    print(f"{passed} passed, {failed} failed in {time.monotonic() - started:.1f} s")
    return 0 if failed == 0 and passed == len(tests) else 1


if __name__ == "__main__":
    sys.exit(main())
