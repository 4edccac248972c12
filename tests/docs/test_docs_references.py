"""Every repository path, module and ``sapwood`` command named in README.md and docs/ exists.

What counts as a path and how it resolves is decision 0004 (docs/decisions/0004-docs-reference-test.md).
CHANGELOG.md is not read: it names files as they were when a change was made.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("platform", "ingest", "rollout", "learner", "scheduler", "api", "demo")
TOP_LEVEL = {*COMPONENTS, "tests", "bench", "scripts", "docs", "migrations", ".ci"}
FILE_SUFFIXES = (".py", ".md", ".json", ".png", ".svg", ".toml", ".yml", ".yaml", ".ini", ".sh", ".txt")
README_MAX_LINES = 150

#: Paths a doc may name that are not in the repository, each with what makes them.
NOT_IN_REPOSITORY = {
    "reward.png": "written by `sapwood demo` into its output folder",
    "lag.png": "written by `sapwood demo` into its output folder",
    "roles.png": "written by `sapwood demo --elastic`",
    "switch_phases.png": "written by `sapwood demo --elastic`",
    "reward_curves.png": "written by `sapwood chaos training` into its --out folder",
    "param_and_grad_buffer.py": "megatron-core's source",
    "tensor_parallel/mappings.py": "megatron-core's source",
}
#: Prefixes of generated paths: benchmark charts, the servers' state folder.
GENERATED_PREFIXES = ("out/", ".services/")


def documents() -> list[Path]:
    """README.md and every Markdown page under docs/ (decisions included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@cache
def repository_files() -> tuple[str, ...]:
    """Every file and folder of the checkout as a POSIX path relative to the root (no caches, no .git)."""
    found: list[str] = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        parts = rel.parts
        if any(p in {"__pycache__", "node_modules", "site"} or p.endswith(".egg-info") for p in parts):
            continue
        if parts[0].startswith(".") and parts[0] != ".ci":
            continue
        found.append(rel.as_posix() + ("/" if path.is_dir() else ""))
    return tuple(found)


def split_code(text: str) -> tuple[str, list[str]]:
    """The text without fenced code blocks, and the contents of those that hold commands (not ``text``)."""
    blocks: list[str] = []

    def keep(match: re.Match[str]) -> str:
        if match.group(2).strip() != "text":  # a text block is a diagram or an example output
            blocks.append(match.group(3))
        return "\n"

    prose = re.sub(r"^(```|~~~)([^\n]*)\n(.*?)^\1\s*$", keep, text, flags=re.S | re.M)
    return prose, blocks


def inline_spans(prose: str) -> list[str]:
    """Inline code spans; a double-backtick span is read whole and its inner spans too."""
    spans = re.findall(r"``(.+?)``", prose)
    rest = re.sub(r"``(.+?)``", " ", prose)
    spans += re.findall(r"`([^`\n]+)`", rest)
    spans += [inner for outer in list(spans) for inner in re.findall(r"`([^`\n]+)`", outer)]
    return spans


def path_candidates(span: str) -> str | None:
    """The repository path a code span names, or None when it is not a path."""
    token = span.strip()
    if not re.fullmatch(r"[A-Za-z0-9_./-]+(:[A-Za-z0-9_.]+)?", token) or token.startswith("/"):
        return None
    token = token.split(":", 1)[0]
    first = token.split("/", 1)[0]
    if token.endswith(FILE_SUFFIXES) or (("/" in token) and first in TOP_LEVEL):
        return token
    return None


def resolves(path: str) -> bool:
    """Whether a named path exists: from the root, under a component's package, as a suffix, or by name."""
    if path in NOT_IN_REPOSITORY or path.startswith(GENERATED_PREFIXES):
        return True
    bare = path.rstrip("/")
    if (ROOT / bare).exists():
        return True
    first, _, rest = bare.partition("/")
    if first in COMPONENTS and rest and (ROOT / first / "src" / "sapwood" / first / rest).exists():
        return True
    files = repository_files()
    if "..." in bare:
        pattern = re.escape(bare).replace(re.escape("/.../"), "/(?:.+/)?")
        return any(re.fullmatch(r"(?:.+/)?" + pattern + "/?", f) for f in files)
    if "/" in bare:
        return any(f.rstrip("/") == bare or f.rstrip("/").endswith("/" + bare) for f in files)
    return any(f.rstrip("/").rsplit("/", 1)[-1] == bare for f in files)


def module_resolves(dotted: str) -> bool:
    """Whether ``sapwood.<component>.a.b`` is a module, or a name defined in the longest module prefix."""
    parts = dotted.split(".")
    base = ROOT / parts[1] / "src" / "sapwood" / parts[1]
    source: Path | None = base / "__init__.py"
    rest = parts[2:]
    while rest:
        package, module = base / rest[0], base / f"{rest[0]}.py"
        if package.is_dir():
            base, source, rest = package, package / "__init__.py", rest[1:]
        elif module.is_file():
            source, rest = module, rest[1:]
            break
        else:
            break
    if not rest:
        return True
    return source is not None and source.is_file() and re.search(rf"\b{re.escape(rest[0])}\b",
                                                                 source.read_text()) is not None


def link_targets(prose: str) -> list[str]:
    """Relative Markdown link and image targets, without anchors."""
    targets = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def command_lines(text: str) -> Iterator[str]:
    """Every ``sapwood <words...>`` named in code spans and code blocks, cut at a pipe, comment or quote."""
    prose, blocks = split_code(text)
    for chunk in [*inline_spans(prose), *blocks]:
        for match in re.finditer(r"(?<![\w./\-\['\"])sapwood((?: +[^\s`#|;&)'\"]+)+)", chunk):
            yield "sapwood" + match.group(1)


@cache
def cli() -> Any:
    """The command tree that ``sapwood --help`` prints (Typer's click-style group: ``.commands``, ``.params``)."""
    from sapwood.platform.cli import app

    return typer.main.get_command(app)


def subcommands(command: Any) -> dict[str, Any] | None:
    """A group's subcommands by name, or None for a leaf command."""
    commands = getattr(command, "commands", None)
    return commands if isinstance(commands, dict) else None


def command_error(line: str) -> str | None:
    """What in ``sapwood ...`` does not exist in the CLI, or None."""
    command = cli()
    path = ["sapwood"]
    for raw in line.split()[1:]:
        token = raw.strip("[](),")
        if not token or token == "...":
            continue
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            known = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            if name not in known:
                return f"`{' '.join(path)}` has no option {name} (it has {', '.join(sorted(known))})"
            continue
        children = subcommands(command)
        if children is not None:
            if token in children:
                command = children[token]
                path.append(token)
                continue
            if re.fullmatch(r"[a-z][a-z-]*", token):
                return f"`{' '.join(path)}` has no command {token!r} (it has {', '.join(sorted(children))})"
        # a positional argument or an option's value
    return None


def problems(doc: Path, text: str) -> list[str]:
    """Every path, link, module or command the document names that does not exist."""
    prose, _blocks = split_code(text)
    found = []
    for span in inline_spans(prose):
        path = path_candidates(span)
        if path is not None and not resolves(path):
            found.append(f"path `{path}` does not exist")
        # sapwood.<component>...: a module or a name in one (`sapwood.events` is a topic, `sapwood.db` a file)
        components = "|".join(COMPONENTS)
        for dotted in re.findall(rf"\bsapwood\.(?:{components})(?:\.[A-Za-z_]\w*)*", span):
            if not module_resolves(dotted):
                found.append(f"module `{dotted}` does not exist")
    for target in link_targets(prose):
        if not (doc.parent / target).exists():
            found.append(f"link target {target} does not exist (relative to {doc.parent.relative_to(ROOT)})")
    for line in command_lines(text):
        error = command_error(line)
        if error is not None:
            found.append(f"command `{line}`: {error}")
    return [f"{doc.relative_to(ROOT)}: {p}" for p in found]


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_module_and_command_a_doc_names_exists(doc: Path) -> None:
    found = problems(doc, doc.read_text())
    assert found == [], "\n".join(found)


def test_a_doc_naming_a_missing_file_module_or_command_is_reported() -> None:
    doc = ROOT / "docs" / "scratch.md"
    text = (
        "See `platform/src/sapwood/platform/no_such_module.py`, `learner/gone.py`, `sapwood.platform.nope`,\n"
        "[a page](no-such-page.md), `sapwood frobnicate`, and:\n\n```bash\nsapwood stats --no-such-option\n```\n"
    )
    found = problems(doc, text)
    assert found == [
        "docs/scratch.md: path `platform/src/sapwood/platform/no_such_module.py` does not exist",
        "docs/scratch.md: path `learner/gone.py` does not exist",
        "docs/scratch.md: module `sapwood.platform.nope` does not exist",
        "docs/scratch.md: link target no-such-page.md does not exist (relative to docs)",
        "docs/scratch.md: command `sapwood frobnicate`: `sapwood` has no command 'frobnicate' (it has "
        + ", ".join(sorted(cli().commands)) + ")",
        f"docs/scratch.md: command `sapwood stats --no-such-option`: {command_error('sapwood stats --no-such-option')}",
    ]


def test_existing_paths_commands_and_modules_resolve() -> None:
    doc = ROOT / "docs" / "scratch.md"
    text = (
        "`platform/storage/runs.py`, `storage/sqlite/offsets.py`, `learner/.../losses.py`, `codec.py`,\n"
        "`api/src/sapwood/api/cursors.py`, `sapwood.platform.tree.logical_parent_sql`, [home](index.md),\n"
        "`sapwood runs add-prompts RUN --from FILE [--epochs E]`, `sapwood db upgrade | downgrade REV`\n"
    )
    assert problems(doc, text) == []


def test_readme_fits_on_one_screen_and_a_bit() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"
