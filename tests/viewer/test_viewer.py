"""The corpus viewer: what each page shows matches what the corpus holds (checked against DuckDB directly), the
filters narrow the list with bound parameters, model-written text is shown as text, and the real server serves
real pages to a real browser (Debian's chromium, driven by Selenium)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from html import unescape
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from storage import Corpus
from storage.selections import SELECTIONS
from tests.helpers import REPO, SCRIPTED, free_port
from tests.viewer.corpus import HOSTILE, build
from viewer import plots, run_url
from viewer.app import create_app

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer-corpus")
    return root, build(root)


@pytest.fixture(scope="module")
def con(built):
    return Corpus(built[0]).connect()


@pytest.fixture(scope="module")
def client(built):
    return TestClient(create_app(built[0], page_size=15))


def listed(html: str) -> tuple[int, list[str]]:
    """The total a task list says and the task ids on its page."""
    total = int(re.search(r'<p id="total">(\d+) task', html).group(1))
    return total, re.findall(r'<a class="id" href="/tasks/[^/"]+/([^"]+)">', html)


# --- runs --------------------------------------------------------------------------------------------------------
def test_runs_page_lists_every_run_with_its_stage_status_and_counts(built, client, con):
    root, ids = built
    html = client.get("/").text
    for run_id in Corpus(root).runs():
        assert f'href="/runs/{run_id}"' in html
    synth = ids["synthesize"]
    tasks, accepted = con.execute("SELECT count(*), count(*) FILTER (accepted) FROM tasks WHERE run_id = ?",
                                  [synth]).fetchone()
    row = re.search(rf'href="/runs/{synth}">.*?</tr>', html, re.S).group(0)
    assert "<td>synthesize</td>" in row and ">complete<" in row and f">{tasks}</a> ({accepted})" in row
    curate_row = re.search(rf'href="/runs/{ids["curate"]}">.*?</tr>', html, re.S).group(0)
    difficulty = con.execute("SELECT count(*) FROM difficulty").fetchone()[0]
    assert "<td>curate</td>" in curate_row and f"difficulty {difficulty}<" in curate_row


def test_a_run_page_shows_its_manifest_and_the_plots_of_its_stage(built, client):
    root, ids = built
    page = client.get(f"/runs/{ids['synthesize']}").text
    assert 'id="status" class="ok">complete<' in page and "Acceptance by domain" in page and "GRPO" not in page
    train = client.get("/runs/train-fixture").text
    assert "GRPO reward per step" in train and "Acceptance by domain" not in train
    missing = client.get("/runs/no-such-run")
    assert missing.status_code == 404 and "no run &#39;no-such-run&#39;" in missing.text


def test_the_page_sees_a_run_that_starts_after_the_viewer_did(built, client):
    root, _ = built
    before = client.get("/").text
    assert "later-run" not in before
    Corpus(root).write_manifest("later-run", {"run_id": "later-run", "stage": "synthesize", "status": "running"})
    try:
        after = client.get("/").text
        assert 'href="/runs/later-run"' in after and "running" in after
    finally:
        shutil.rmtree(Path(root) / "_runs" / "later-run")


# --- the task browser ----------------------------------------------------------------------------------------------
def _expected(con, where: str, params: list) -> int:
    return con.execute(f"SELECT count(*) FROM tasks t JOIN curation c USING (run_id, task_id) WHERE {where}",
                       params).fetchone()[0]


FILTERS = {  # query parameters -> the same question asked of DuckDB directly
    "domain=retail": ("t.domain = 'retail'", []),
    "accepted=no": ("NOT t.accepted", []),
    "topology=chain&depth=2": ("t.signature.topology = 'chain' AND t.signature.depth = 2", []),
    "bucket=never_solved": ("c.bucket = 'never_solved'", []),
    "bucket=not_probed": ("c.bucket IS NULL", []),
    "necessity=unnecessary": ("c.necessity_label = 'unnecessary'", []),
    "split=sft_v1": ("c.in_sft_v1", []),
    "split=none": (" AND ".join(f"NOT c.in_{k}" for k in SELECTIONS), []),
    "source=env:files": ("t.domain = 'files'", []),
    "run=hostile": ("t.run_id = 'hostile'", []),
    "q=hostile-var": ("t.task_id = 'hostile-variant'", []),
}


@pytest.mark.parametrize("query", list(FILTERS))
def test_each_filter_lists_exactly_the_tasks_duckdb_finds(client, con, query):
    where, params = FILTERS[query]
    expected = _expected(con, where, params)
    assert expected > 0, f"the fixture has no task for {query}: the test would prove nothing"
    total, _ = listed(client.get(f"/tasks?{query}").text)
    assert total == expected
    assert total < con.execute("SELECT count(*) FROM tasks").fetchone()[0]


def test_pages_split_the_list_without_gaps_or_repeats(client, con):
    everything = con.execute("SELECT count(*) FROM tasks").fetchone()[0]
    seen, page = [], 1
    while True:
        html = client.get(f"/tasks?page={page}").text
        total, ids = listed(html)
        seen += ids
        if 'id="next"' not in html:
            break
        assert f'href="/tasks?page={page + 1}"' in html
        page += 1
    assert total == everything == len(seen) == len(set(seen)) and page == -(-everything // 15)


def test_filter_values_are_bound_never_spliced_into_sql(client, con):
    hostile = ["retail' OR '1'='1", "x'); DROP VIEW tasks; --", "%", "_"]
    for value in hostile:
        page = client.get("/tasks", params={"domain": value})
        assert page.status_code == 200 and listed(page.text)[0] == 0
    assert listed(client.get("/tasks", params={"q": "%"}).text)[0] == 0  # a LIKE wildcard in text matches itself
    assert con.execute("SELECT count(*) FROM tasks").fetchone()[0] > 0


@pytest.mark.parametrize(("query", "named"), [("depth=deep", "depth=&#39;deep&#39;"), ("accepted=maybe", "yes or no"),
                                               ("split=sft_v9", "sft_v1"), ("page=0", "page number")])
def test_a_bad_filter_is_a_400_that_names_it(client, query, named):
    page = client.get(f"/tasks?{query}")
    assert page.status_code == 400 and named in page.text


# --- one task ------------------------------------------------------------------------------------------------------
def _task_with_rollouts(con) -> tuple[str, str]:
    return con.execute("SELECT run_id, task_id FROM trajectories WHERE role = 'rollout' ORDER BY task_id LIMIT 1"
                       ).fetchone()


def test_a_task_page_shows_each_call_with_its_result_and_every_control_with_what_rejected_it(client, con):
    run_id, task_id = _task_with_rollouts(con)
    html = client.get(f"/tasks/{run_id}/{task_id}").text
    reference = html.split('<section id="reference">')[1].split("</section>")[0]
    messages = con.execute("SELECT messages FROM trajectories WHERE task_id = ? AND role = 'reference'",
                           [task_id]).fetchone()[0]
    calls = [c for m in messages for c in m["tool_calls"] or []]
    results = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert calls and len(re.findall(r'<div class="call">', reference)) == len(calls)
    for call in calls:
        assert f'<span class="name">{call["function"]["name"]}</span>' in reference
        assert call["id"] in results  # every call was answered, so none says "no result"
    assert "no result" not in reference and reference.count('<pre class="result">') == len(calls)
    controls = con.execute("""SELECT tr.role, list(c.name ORDER BY c.name) FILTER (NOT c.passed)
                              FROM trajectories tr JOIN verdicts v USING (trajectory_id, task_id),
                                   UNNEST(v.components) AS u(c)
                              WHERE tr.task_id = ? AND NOT v.expected_pass AND tr.run = tr.run_id GROUP BY 1""",
                           [task_id]).fetchall()
    table = html.split('<table id="controls">')[1].split("<h2>Model conversations</h2>")[0]
    assert len(controls) >= 5 and table.count('<tr class="control">') == len(controls)
    for role, rejected in controls:
        row = table.split(f'<tr class="control"><td>{role}</td>')[1].split('<tr class="control">')[0]
        shown = re.findall(r'<span class="tag component" title="[^"]*">([^<]+)</span>', row.split("<details>")[0])
        assert sorted(shown) == rejected and rejected, role


def test_a_task_page_shows_the_llm_attempts_with_their_hints_and_verdicts(client, con):
    run_id, task_id = _task_with_rollouts(con)
    html = client.get(f"/tasks/{run_id}/{task_id}").text
    attempts = con.execute("""SELECT tr.metadata.attempt, tr.metadata.hint, v.passed FROM trajectories tr
                              JOIN verdicts v USING (trajectory_id, task_id)
                              WHERE tr.task_id = ? AND tr.role = 'rollout' ORDER BY 1""", [task_id]).fetchall()
    shown = re.findall(r'<div class="rollout" data-role="rollout">.*?attempt (\d+)(?: · hint <span class="tag hint">'
                       r'(\w+)</span>)?.*?<span class="(ok|bad)">', html, re.S)
    assert len(attempts) >= 2 and [(int(a), h or None, v == "ok") for a, h, v in shown] == attempts
    assert {h for _, h, _ in attempts} >= {None, "plan"}


def test_a_task_page_shows_its_curation_labels(client, con):
    run_id, task_id, bucket, p_hat, min_calls, ref_calls = con.execute(
        "SELECT run_id, task_id, bucket, pass_rate, min_calls, ref_calls FROM curation WHERE bucket IS NOT NULL "
        "ORDER BY task_id LIMIT 1").fetchone()
    html = client.get(f"/tasks/{run_id}/{task_id}").text
    assert f'<dd id="bucket">{bucket}</dd>' in html and f'<dd id="p-hat">{p_hat:.2f}' in html
    assert f'<dd id="min-calls">{min_calls} of {ref_calls} in the reference</dd>' in html
    assert 'data-role="probe"' in html  # the difficulty probe's rollouts, with their verdicts


def test_lineage_links_a_variant_and_its_parent_both_ways(built, client):
    _, ids = built
    run, variant, parent = ids["hostile"]
    synth = ids["synthesize"]
    child_page = client.get(f"/tasks/{run}/{variant}").text
    assert f'href="/tasks/{synth}/{parent}"' in child_page.split('id="lineage"')[1]
    parent_page = client.get(f"/tasks/{synth}/{parent}").text
    assert f'href="/tasks/{run}/{variant}"' in parent_page.split('id="lineage"')[1]


def test_text_from_models_is_shown_as_text_on_every_page(built, client):
    _, ids = built
    run, variant, _ = ids["hostile"]
    for url in (f"/tasks/{run}/{variant}", "/tasks?run=hostile", "/tasks?q=" + "%3Cscript%3E"):
        html = client.get(url).text
        assert "<script" not in html.lower() and "<img" not in html.lower(), url
    page = client.get(f"/tasks/{run}/{variant}").text
    assert page.count("&lt;script&gt;document.title=") >= 4  # goal, requests, private info, tool results
    assert HOSTILE in unescape(page)


def test_an_unknown_task_is_a_404_that_names_it(client):
    page = client.get("/tasks/nope/missing-task")
    assert page.status_code == 404 and "missing-task" in page.text and "nope" in page.text


# --- plots -------------------------------------------------------------------------------------------------------
def test_plots_draw_what_the_tables_hold(client, con):
    html = client.get("/plots").text
    blocks = dict(re.findall(r'<div class="plot" data-plot="([^"]+)">(.*?)</div>\n', html, re.S))
    assert len(blocks) == 5 and all("<svg" in b for b in blocks.values()), [t for t, b in blocks.items() if "<svg" not in b]
    steps = con.execute("SELECT count(*) FROM grpo_steps").fetchone()[0]
    assert blocks["GRPO reward per step"].count("<circle") == steps
    stages = re.findall(r'text-anchor="middle" fill="#222" >(\w+)</text>', blocks["Evaluation per stage"])
    assert stages == ["base", "sft", "grpo"]
    cells = con.execute("SELECT count(DISTINCT (domain, signature.depth)) FROM tasks").fetchone()[0]
    assert blocks["Acceptance by domain × depth"].count("accepted</title>") == cells
    probed = con.execute("SELECT count(*) FROM difficulty_latest").fetchone()[0]
    assert f"{probed} task(s)" in blocks["p̂ histogram"]


def test_plots_say_no_data_yet_until_a_stage_has_run(tmp_path):
    from generators.config import SynthesizeConfig
    from stages.synthesize import run_batch

    (tmp_path / "_runs").mkdir()
    empty = TestClient(create_app(tmp_path))
    assert empty.get("/plots").text.count("no data yet") == 5
    assert "no runs yet" in empty.get("/").text and "no tasks yet" in empty.get("/tasks").text
    corpus = Corpus(tmp_path)
    config = SynthesizeConfig(run_name="only", n_tasks=6, batch_size=6, agents=SCRIPTED)
    result = run_batch(config, 0)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(config.run_id, {"stage": "synthesize", "status": "complete"})
    html = empty.get("/plots").text  # the same app: it sees the new run
    # acceptance is drawn; coverage waits for a catalog (the stage's prepare writes it, run_batch does not)
    assert html.count("no data yet") == 4 and "accepted</title>" in html


def test_svg_labels_are_escaped():
    svg = plots.heatmap([("<b>shop</b>", 1, 2, 1)]) + plots.bars([("a&b", 0.5, "<i>1</i>")], "t") + \
        plots.lines({"<run>": [(0, 0.1), (1, 0.2)]}, "t", "y") + plots.grouped([("<x>", [("p", 0.5)])], "t")
    assert "<b>" not in svg and "<i>" not in svg and "<run>" not in svg and "<x>" not in svg
    assert "&lt;b&gt;shop&lt;/b&gt;" in svg and "a&amp;b" in svg
    assert plots.histogram([]) is None and plots.lines({}, "t", "y") is None


def test_run_url_is_the_viewers_run_page_when_a_viewer_url_is_known(monkeypatch):
    monkeypatch.delenv("SYNTHLOOP_VIEW_URL", raising=False)
    assert run_url("synthesize-1a2b") is None
    monkeypatch.setenv("SYNTHLOOP_VIEW_URL", "http://127.0.0.1:8765/")
    assert run_url("synthesize-1a2b") == "http://127.0.0.1:8765/runs/synthesize-1a2b"
    assert run_url("a/b c", base="http://v") == "http://v/runs/a%2Fb%20c"


def test_view_without_a_corpus_says_so_and_serves_nothing(tmp_path, capsys):
    from flows.cli import main

    assert main(["view", "--corpus", str(tmp_path / "nowhere")]) == 2
    assert f"no corpus at {tmp_path / 'nowhere'}" in capsys.readouterr().err


# --- a real browser against the real server ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(built):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", "--corpus", str(built[0]), "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"synthloop view did not start: {proc.stdout.read().decode()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        message = (f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}); "
                   "`sh scripts/system-deps.sh test` installs them")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.slow
def test_every_page_renders_in_a_real_browser(server, browser, built, tmp_path):
    from selenium.webdriver.common.by import By

    _, ids = built
    for path, heading in [("/", "Runs"), ("/tasks", "Tasks"), ("/plots", "The corpus at a glance"),
                          (f"/runs/{ids['synthesize']}", f"Run {ids['synthesize']}")]:
        browser.get(server + path)
        assert browser.find_element(By.TAG_NAME, "h1").text == heading
        assert _console_errors(browser) == [], path
    browser.get(server + "/plots")
    svgs = browser.find_elements(By.CSS_SELECTOR, ".plot svg")
    assert len(svgs) == 5 and all(s.size["width"] > 100 and s.size["height"] > 50 for s in svgs)
    shot = tmp_path / "plots.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 20_000  # drawn, not a blank page


@pytest.mark.slow
def test_changing_a_filter_in_the_browser_changes_what_is_listed(server, browser, con):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait

    def apply() -> None:  # submit the form and wait for the new page
        old = browser.find_element(By.ID, "total")
        browser.find_element(By.ID, "apply").click()
        WebDriverWait(browser, 10).until(EC.staleness_of(old))

    def shown() -> tuple[str, list[tuple[str, str]]]:
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.task-row")
        return (browser.find_element(By.ID, "total").text,
                [(r.get_attribute("data-domain"), r.get_attribute("data-accepted")) for r in rows])

    browser.get(server + "/tasks")
    total_all, rows_all = shown()
    Select(browser.find_element(By.ID, "filter-domain")).select_by_visible_text("calendar")
    apply()
    assert "domain=calendar" in browser.current_url
    total_cal, rows_cal = shown()
    expected = con.execute("SELECT count(*) FROM tasks WHERE domain = 'calendar'").fetchone()[0]
    assert total_cal == f"{expected} task(s)" != total_all and {d for d, _ in rows_cal} == {"calendar"}
    assert len(rows_cal) == expected < len(rows_all)
    # the chosen value stays selected, so a second filter narrows the first
    assert Select(browser.find_element(By.ID, "filter-domain")).first_selected_option.text == "calendar"
    Select(browser.find_element(By.ID, "filter-accepted")).select_by_visible_text("yes")
    apply()
    _, rows_both = shown()
    accepted = con.execute("SELECT count(*) FROM tasks WHERE domain = 'calendar' AND accepted").fetchone()[0]
    assert set(rows_both) == {("calendar", "true")} and len(rows_both) == accepted


@pytest.mark.slow
def test_a_task_page_in_the_browser_shows_its_tool_calls_and_verdicts(server, browser, con):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    run_id, task_id = _task_with_rollouts(con)
    browser.get(f"{server}/tasks?q={task_id}")
    browser.find_element(By.LINK_TEXT, task_id).click()
    WebDriverWait(browser, 10).until(EC.title_contains(f"Task {task_id}"))
    assert browser.find_element(By.TAG_NAME, "h1").text == f"Task {task_id}"
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#reference .call .name")]
    plan = con.execute("SELECT signature.n_calls FROM tasks WHERE task_id = ?", [task_id]).fetchone()[0]
    assert len(names) == plan and all(names)
    results = browser.find_elements(By.CSS_SELECTOR, "#reference .call pre.result")
    assert len(results) == plan and all(r.is_displayed() and r.text for r in results)
    assert "passed" in browser.find_element(By.CSS_SELECTOR, "#reference p").text
    controls = browser.find_elements(By.CSS_SELECTOR, "#controls tr.control")
    assert len(controls) >= 5 and all("failed" in c.text and "rejected by" in c.text for c in controls)
    # a control's conversation is folded; opening it shows its calls
    first = controls[0]
    inner = first.find_elements(By.CSS_SELECTOR, "details .turn")
    assert inner and not inner[0].is_displayed()
    first.find_element(By.TAG_NAME, "summary").click()
    assert inner[0].is_displayed()
    rollouts = browser.find_elements(By.CSS_SELECTOR, 'div.rollout[data-role="rollout"]')
    hints = [h.text for h in browser.find_elements(By.CSS_SELECTOR, 'div.rollout[data-role="rollout"] .hint')]
    assert len(rollouts) >= 2 and "plan" in hints
    assert _console_errors(browser) == []


@pytest.mark.slow
def test_a_runs_summary_artifact_links_to_its_viewer_page(prefect_server, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.synthesize import synthesize
    from generators.config import SynthesizeConfig

    monkeypatch.setenv("SYNTHLOOP_VIEW_URL", "http://viewer.test:8765")
    config = SynthesizeConfig(run_name="linked", n_tasks=4, batch_size=4, agents=SCRIPTED)
    synthesize(config=config, corpus_root=str(tmp_path))
    key = f"synthesize-summary-{config.run_id}".lower()
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    link = re.search(r"\]\((http://viewer\.test:8765(/runs/[^)]+))\)", artifacts[0].data)
    assert link and link.group(1) == run_url(config.run_id)
    page = TestClient(create_app(tmp_path)).get(link.group(2))  # the viewer serving that corpus answers it
    assert page.status_code == 200 and f'<h1>Run <span class="id">{config.run_id}</span></h1>' in page.text


@pytest.mark.slow
def test_the_server_answers_concurrent_requests(server, con):
    from concurrent.futures import ThreadPoolExecutor

    run_id, task_id = _task_with_rollouts(con)
    paths = ["/", "/tasks", "/tasks?accepted=no", f"/tasks/{run_id}/{task_id}", "/plots"] * 6
    with httpx.Client(timeout=60) as http, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: http.get(server + p), paths))
    assert [a.status_code for a in answers] == [200] * len(paths)
    assert len({a.text for a in answers if a.url.path == f"/tasks/{run_id}/{task_id}"}) == 1
