"""Every relative markdown link and every backticked repository path in README.md and docs/**/*.md names a file or
folder that a clone of the repository holds (a tracked file, or a folder of tracked files). Paths under runs/ and
benchmark/out/ are git-ignored, so a link there fails: a figure in the docs stands on a file under docs/results/.
A backticked `benchmark/out/...` names where a command writes (an output folder, not evidence) and is not checked."""

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
BACKTICKED = re.compile(r"`([^`\s]+)`")
# A backticked token is read as a repository path when it starts with one of the repository's top-level folders.
REPO_ROOTS = ("cleanrl_astral/", "cleanrl_astral_utils/", "benchmark/", "docs/", "tests/")
OUTPUT = "benchmark/out/"  # git-ignored; a command's output folder
PLACEHOLDER = re.compile(r"[*?{}<>$\[\]]")


def tracked_paths(repo):
    """(files, folders) of the repository: `git ls-files` where it is a git checkout, else every file on disk."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout
        files = set(out.split("\n")) - {""}
    except (OSError, subprocess.CalledProcessError):
        files = set()
        for root, _dirs, names in os.walk(repo):
            for name in names:
                files.add(os.path.relpath(os.path.join(root, name), repo))
    folders = set()
    for f in files:
        parent = os.path.dirname(f)
        while parent:
            folders.add(parent)
            parent = os.path.dirname(parent)
    return files, folders


def link_targets(text):
    """Relative targets of the markdown links (inline, image and reference links) outside fenced code blocks."""
    prose = FENCE.sub("", text)
    targets = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)
    relative = []
    for target in targets:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:, ...) or an anchor in the same page
        path = target.split("#")[0].split("?")[0]
        if path:
            relative.append(path)
    return relative


def backticked_paths(text):
    """Backticked repository paths outside fenced code blocks: tokens that start with a top-level folder, without glob
    or placeholder characters; a pytest node id (`tests/x.py::name`) is read as its file. A token with one colon
    (`commit:path`, `file:line`) names no path of the working tree and is skipped."""
    paths = []
    for token in BACKTICKED.findall(FENCE.sub("", text)):
        token = token.split("::")[0]
        if ":" in token or PLACEHOLDER.search(token) or not token.startswith(REPO_ROOTS) or token.startswith(OUTPUT):
            continue
        paths.append(token.rstrip("/"))
    return paths


def missing_paths(repo, doc_paths):
    """[(doc, target)] of every link or backticked path in the docs that the repository does not hold."""
    files, folders = tracked_paths(repo)
    missing = []
    for doc in doc_paths:
        with open(os.path.join(repo, doc)) as f:
            text = f.read()
        for target in link_targets(text):
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if path not in files and path not in folders:
                missing.append((doc, target))
        for target in backticked_paths(text):
            path = os.path.normpath(target)
            if path not in files and path not in folders:
                missing.append((doc, target))
    return missing


def docs_of(repo):
    files, _folders = tracked_paths(repo)
    return sorted(f for f in files if f == "README.md" or (f.startswith("docs/") and f.endswith(".md")))


def test_docs_link_only_files_of_the_repository():
    docs = docs_of(REPO)
    assert "README.md" in docs and "docs/plans.md" in docs, docs
    missing = missing_paths(REPO, docs)
    assert missing == [], "links to paths that a clone lacks:\n" + "\n".join(f"{doc}: {target}" for doc, target in missing)


def test_missing_link_targets_are_found(tmp_path):
    """The check reports a link into a missing file, an ignored run folder and a missing backticked path, and passes
    links to present files and folders, URLs, anchors and fenced code."""
    (tmp_path / "docs" / "results" / "x").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "x" / "eval.json").write_text("{}")
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "benchmark" / "run.sh").write_text("")
    (tmp_path / "docs" / "page.md").write_text(
        "[ok](results/x/eval.json) [folder](results/x) [anchor](results/x/eval.json#top) [url](https://example.org/a.md)\n"
        "[same page](#section) `benchmark/run.sh` `benchmark/out/{name}` `benchmark/out/sweep`\n"
        "`tests/test_gone.py::test_a` `abc1234:docs/gone.md`\n"
        "![figure](results/x/curve.png) [runs](../runs/run1/eval.json) `benchmark/gone.sh`\n"
        "[ref]: results/x/missing.md\n"
        "```bash\n[in code](nowhere.md) `benchmark/nowhere.sh`\n```\n"
    )
    (tmp_path / "README.md").write_text("[page](docs/page.md) [gone](docs/gone.md)\n")
    missing = missing_paths(str(tmp_path), ["README.md", "docs/page.md"])
    assert sorted(missing) == [
        ("README.md", "docs/gone.md"),
        ("docs/page.md", "../runs/run1/eval.json"),
        ("docs/page.md", "benchmark/gone.sh"),
        ("docs/page.md", "results/x/curve.png"),
        ("docs/page.md", "results/x/missing.md"),
        ("docs/page.md", "tests/test_gone.py"),
    ]
