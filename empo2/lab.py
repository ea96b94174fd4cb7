"""Notebooks as users open them: the project's kernel, the git filter that strips outputs, the committed form.

    python -m empo2.lab install     # the `empo2` kernel and the save hook in this environment; the filter in git
    python -m empo2.lab normalise   # rewrite notebooks/*.ipynb in their committed form
    python -m empo2.lab check       # exit 1 naming each notebook that is not in its committed form

The committed form is what the git filter leaves of a notebook that JupyterLab
ran and saved: no outputs, no execution counts, the kernelspec of the `empo2`
kernel, `language_info` reduced to the language's name, no view state. Cell
ids and tags (papermill's `parameters`) stay.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from empo2 import ROOT

KERNEL_NAME = "empo2"
KERNEL_DISPLAY_NAME = "empo2 (.venv)"
KERNELSPEC = {"display_name": KERNEL_DISPLAY_NAME, "language": "python", "name": KERNEL_NAME}
LANGUAGE_INFO = {"name": "python"}

# What JupyterLab writes when it runs and saves a notebook, beyond what nbstripout strips by default
# (outputs, execution counts, widget state, cell flags `collapsed`, `scrolled`, `execution`, ...):
# the running kernel's language details, and hidden inputs/outputs (`jupyter.source_hidden`, `jupyter.outputs_hidden`).
EXTRA_KEYS = [
    "metadata.language_info.codemirror_mode",
    "metadata.language_info.file_extension",
    "metadata.language_info.mimetype",
    "metadata.language_info.nbconvert_exporter",
    "metadata.language_info.pygments_lexer",
    "metadata.language_info.version",
    "cell.metadata.jupyter",
]


def clean_command() -> list[str]:
    """The git clean filter: nbstripout, keeping cell ids (JupyterLab keeps them, so diffs stay small)."""
    return [sys.executable, "-m", "nbstripout", "--keep-id", "--extra-keys", " ".join(EXTRA_KEYS)]


def install_kernel() -> str:
    """Install the `empo2` kernel into this environment (sys.prefix), where its own Jupyter finds it."""
    from ipykernel.kernelspec import install

    return install(kernel_name=KERNEL_NAME, display_name=KERNEL_DISPLAY_NAME, prefix=sys.prefix)


def server_config_path() -> Path:
    """The file that enables this module as a server extension of this environment's Jupyter."""
    return Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "empo2.json"


def install_save_hook() -> Path:
    """Enable `post_save` (below) in this environment's Jupyter server."""
    path = server_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"empo2.lab": True}}}, indent=1) + "\n")
    return path


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "empo2.lab"}]


def _load_jupyter_server_extension(serverapp) -> None:
    serverapp.contents_manager.register_post_save_hook(post_save)


def post_save(model, os_path, contents_manager, **kwargs) -> None:
    """Jupyter's post-save hook: after a save, a notebook whose committed form did not change is clean in git.

    git status reports a file whose size differs from the index's as modified without running the
    clean filter, so a notebook saved with outputs would show as modified although `git diff` is
    empty. Re-adding it when the filter leaves it unchanged records its new size and stages nothing.
    Runs in the background: the filter takes seconds to start.
    """
    if model.get("type") == "notebook":
        threading.Thread(target=refresh_git_index, args=(Path(os_path),), daemon=True).start()


_git_lock = threading.Lock()


def refresh_git_index(path: Path) -> bool:
    """`git add` a filtered notebook whose cleaned content equals the index's; True if it did."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args, "--", path.name], cwd=path.parent, capture_output=True, text=True)

    with _git_lock:  # one save at a time: git's index takes one writer
        try:
            saved = path.stat().st_mtime_ns
            if (git("check-attr", "filter").stdout.strip().endswith(": filter: nbstripout")
                    and git("ls-files", "--error-unmatch").returncode == 0
                    and git("diff", "--quiet").returncode == 0
                    and path.stat().st_mtime_ns == saved):  # a newer save is checked by its own call
                return git("add").returncode == 0
        except OSError:  # no git, or the file went away
            pass
    return False


def install_filter(repo: Path = ROOT) -> bool:
    """Point the nbstripout filter named in .gitattributes at this environment; False unless `repo` is a checkout."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=repo, capture_output=True, text=True)
    except FileNotFoundError:  # no git
        return False
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo.resolve():
        return False
    command = shlex.join(clean_command())
    for key, value in [("filter.nbstripout.clean", command), ("filter.nbstripout.smudge", "cat"),
                       ("filter.nbstripout.required", "true"), ("diff.ipynb.textconv", command + " --textconv")]:
        subprocess.run(["git", "config", "--local", key, value], cwd=repo, check=True)
    return True


def clean(paths: list[Path]) -> None:
    """Apply the git filter to notebook files in place (one process for all: nbstripout takes seconds to start)."""
    result = subprocess.run(clean_command() + [str(p) for p in paths], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nbstripout failed: {result.stderr.strip()[-300:]}; run `make setup` to install it")


def prepared(text: str) -> str:
    """A notebook's text with the project's kernelspec and language_info, before the filter."""
    import nbformat

    notebook = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    notebook.metadata["kernelspec"] = dict(KERNELSPEC)
    notebook.metadata["language_info"] = {**LANGUAGE_INFO, **notebook.metadata.get("language_info", {})}
    if (notebook.nbformat, notebook.nbformat_minor) < (4, 5):  # JupyterLab would add random cell ids
        notebook.nbformat_minor = 5
        for i, cell in enumerate(notebook.cells):
            cell.setdefault("id", f"cell-{i:02d}")
    return nbformat.writes(notebook) + "\n"


def committed_forms(paths: list[Path]) -> list[str]:
    """Each notebook's text in its committed form (see the module docstring); the files are left as they are."""
    with tempfile.TemporaryDirectory() as folder:
        copies = [Path(folder) / f"{i}.ipynb" for i in range(len(paths))]
        for path, copy in zip(paths, copies):
            copy.write_text(prepared(path.read_text(encoding="utf-8")), encoding="utf-8")
        clean(copies)
        return [copy.read_text(encoding="utf-8") for copy in copies]


def notebook_paths(paths: list[str] | None = None) -> list[Path]:
    return [Path(p) for p in paths] if paths else sorted((ROOT / "notebooks").glob("*.ipynb"))


def normalise(paths: list[Path]) -> list[Path]:
    """Rewrite each notebook in its committed form; returns those that changed."""
    changed = []
    for path, form in zip(paths, committed_forms(paths)):
        if form != path.read_text(encoding="utf-8"):
            path.write_text(form, encoding="utf-8")
            changed.append(path)
    return changed


def uncommitted(paths: list[Path]) -> list[Path]:
    """The notebooks that are not in their committed form."""
    return [path for path, form in zip(paths, committed_forms(paths)) if form != path.read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("install", "normalise", "check"))
    parser.add_argument("paths", nargs="*", help="notebooks (default: notebooks/*.ipynb)")
    args = parser.parse_args(argv)
    if args.action == "install":
        print(f"kernel {KERNEL_NAME!r} ({KERNEL_DISPLAY_NAME}) installed in {install_kernel()}")
        print(f"save hook for this environment's Jupyter: {install_save_hook()}")
        if install_filter():
            print("git filter nbstripout installed: outputs never reach the committed notebooks")
        else:
            print("not a git checkout: no git filter installed")
    elif args.action == "normalise":
        changed = normalise(notebook_paths(args.paths))
        print(f"{len(changed)} notebook(s) rewritten" + "".join(f"\n  {p}" for p in changed))
    else:
        wrong = uncommitted(notebook_paths(args.paths))
        if wrong:
            sys.exit(f"not in committed form: {', '.join(p.name for p in wrong)}; run `python -m empo2.lab normalise`")
        print("every notebook is in its committed form")


if __name__ == "__main__":
    main()
