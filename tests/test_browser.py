"""A notebook opened the way users open it: JupyterLab in a real browser, Run All Cells, save, and git stays clean.

The notebook is a copy of notebooks/00_quickstart.ipynb at the ci profile, committed in a temporary git
repository with this project's .gitattributes, the nbstripout filter and the save hook that `make setup`
installs, so the test proves them on exactly what JupyterLab writes without touching the tracked notebooks.
The tracked notebooks themselves are checked to be in the form that filter leaves.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat

from empo2 import lab

ROOT = lab.ROOT
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
NOTEBOOK = "notebooks/00_quickstart.ipynb"
HANG_S = 300
"""How long a step may take before the test calls it hung: only a hang ends it, so a busy 2-core machine that starts
the server or runs the notebook slowly does not fail it (nothing here is a speed check)."""


def test_committed_notebooks_are_in_the_form_the_git_filter_leaves():
    wrong = [p.name for p in lab.uncommitted(lab.notebook_paths())]
    assert not wrong, f"not in their committed form: {', '.join(wrong)}; run `python -m empo2.lab normalise`"


GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def make_repo(repo: Path) -> None:
    """A git repository holding the quickstart notebook at the ci profile, committed through the filter."""
    git(repo, "init", "-q")
    shutil.copy(ROOT / ".gitattributes", repo)
    (repo / ".gitignore").write_text((ROOT / ".gitignore").read_text() + "\nresults/\n")
    notebook = json.loads((ROOT / NOTEBOOK).read_text())
    [parameters] = [c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", [])]
    parameters["source"] = "".join(parameters["source"]) + '\nprofile = "ci"'
    (repo / "notebooks").mkdir()
    (repo / NOTEBOOK).write_text(json.dumps(notebook))
    lab.normalise([repo / NOTEBOOK])
    assert lab.install_filter(repo)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "notebook")
    # The saved ci-profile results the notebook reuses, as on a fresh clone (copies: the kernel writes there).
    shutil.copytree(ROOT / "results" / "ci", repo / "results" / "ci",
                    ignore=shutil.ignore_patterns("checkpoints", "scratch", "*.pt", ".*.lock"))


def test_save_hook_leaves_git_clean_for_outputs_and_stages_no_edit(tmp_path):
    make_repo(tmp_path)
    path = tmp_path / NOTEBOOK
    notebook = nbformat.read(path, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    code[0].outputs = [nbformat.v4.new_output("stream", text="ran\n")]
    code[0].execution_count = 1
    nbformat.write(notebook, path)
    assert lab.refresh_git_index(path)
    assert git(tmp_path, "status", "--porcelain") == ""

    code[0].source += "\nprint('an edit')"
    nbformat.write(notebook, path)
    assert not lab.refresh_git_index(path)
    assert git(tmp_path, "status", "--porcelain") == f" M {NOTEBOOK}\n"  # modified, not staged


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(repo: Path, home: Path, port: int, token: str) -> subprocess.Popen:
    """JupyterLab from this environment, rooted at `repo`, with its user settings and state kept under `home`."""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={repo}"]
    if os.getuid() == 0:
        command.append("--allow-root")
    with open(home / "lab.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"JupyterLab exited: {(home / 'lab.log').read_text()[-2000:]}"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise AssertionError(f"JupyterLab not ready after 60 s: {(home / 'lab.log').read_text()[-2000:]}")


def texts(page, selector: str) -> list[str]:
    """The text of every element matching `selector`, on screen or not (cells off screen are not laid out)."""
    return page.eval_on_selector_all(selector, "elements => elements.map(e => e.textContent)")


def test_run_all_and_save_in_jupyterlab_leaves_git_clean(tmp_path):
    assert Path(CHROMIUM).exists(), f"no browser at {CHROMIUM}: run `make test` (it installs Chromium) or set CHROMIUM"
    from jupyter_client.kernelspec import KernelSpecManager
    from playwright.sync_api import Error as PlaywrightError, sync_playwright

    assert lab.KERNEL_NAME in KernelSpecManager().find_kernel_specs(), \
        f"kernel {lab.KERNEL_NAME!r} is not installed: run `make setup`"
    assert lab.server_config_path().exists(), f"no {lab.server_config_path()} (the save hook): run `make setup`"
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    make_repo(repo)
    committed = (repo / NOTEBOOK).read_text()
    port, token = free_port(), "browser-test"
    server = start_lab(repo, home, port, token)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={token}")
                try:  # the status bar reads "empo2 (.venv) | Idle" once the notebook's own kernel is up
                    page.get_by_text(f"{lab.KERNEL_DISPLAY_NAME} | Idle").wait_for(timeout=HANG_S * 1000)
                except PlaywrightError:
                    kernel = page.locator(".jp-NotebookPanel-toolbar .jp-KernelName").all_inner_texts()
                    raise AssertionError(f"the notebook's kernel {lab.KERNEL_DISPLAY_NAME!r} was not idle "
                                         f"after {HANG_S} s; the toolbar shows {kernel}") from None

                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                page.wait_for_function("""() => {
                    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                        .map(p => p.textContent);
                    const idle = document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']");
                    return idle && prompts.some(t => /\\d/.test(t)) && !prompts.some(t => t.includes('*'));
                }""", timeout=HANG_S * 1000)
                stderr = texts(page, '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
                tracebacks = [t for t in stderr if "Traceback" in t]
                assert not tracebacks, f"error output in the page: {tracebacks[0][-1500:]}"
                prompts = texts(page, ".jp-CodeCell .jp-InputArea-prompt")
                assert all(any(ch.isdigit() for ch in p) for p in prompts), f"cells not run: {prompts}"

                page.keyboard.press("Control+s")
                page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.jp-mod-dirty')",
                                       timeout=HANG_S * 1000)
            except Exception:
                page.screenshot(path=str(tmp_path / "page.png"))
                print(f"screenshot: {tmp_path / 'page.png'}; server log: {home / 'lab.log'}")
                raise
            finally:
                browser.close()
        deadline = time.monotonic() + HANG_S  # the server's save hook refreshes git's index in the background
        while (status := git(repo, "status", "--porcelain")) and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        server.terminate()
        server.wait(timeout=30)

    saved = json.loads((repo / NOTEBOOK).read_text())
    outputs = [o for c in saved["cells"] for o in c.get("outputs", [])]
    assert outputs, "the saved notebook has no outputs: the save did not happen"
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert (repo / NOTEBOOK).read_text() != committed
    assert status == "", f"JupyterLab's save shows in git: {status}{git(repo, 'diff')[:3000]}"
