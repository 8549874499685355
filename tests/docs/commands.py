"""The commands of the guides' shell blocks: each one run, or checked against what would run it.

``split(text)`` cuts a ``sh`` block into commands (continuation lines joined, quotes spanning
lines kept, comments dropped; ``# ...`` lines after a command are its expected output).
``Shell.do(command)`` then runs it or checks it, and says which in its answer:

- **run**: ``manage.py`` commands that need no terminal (``add_location``, ``create_token``,
  ``apply_config``, ...) through Django's ``call_command`` on the test database, and ``curl``
  against the live test server (``http://localhost:8000`` in the block is that server's address);
  their output is compared with the expected lines that follow them in the block;
- **checked**: what cannot run inside a test. ``make X``: the target exists in the Makefile and
  every variable set before it is read by the code (the suite runs ``make demo`` in
  ``tests/demo``; ``make test`` is CI itself). ``docker compose``: no Docker engine here, so the
  services named exist in ``docker-compose.yml`` and the ``manage.py`` command inside parses.
  ``torchrun``: torch's own argument parser, then the script's (``parse`` of the example), so
  every flag exists (the examples themselves run in ``tests/sdk/test_example_*.py`` and
  ``tests/integrations``). ``python -m recoverydash.sdk``: the SDK's parser, and a drill's
  training command after ``--`` checked the same way. An interactive ``manage.py`` command
  (``createsuperuser``): its parser. ``cp``: the source exists. ``pytest``: the paths exist and
  the ``-m`` markers are declared.

An unknown command fails: a new kind of command needs a handler here, never a silent pass.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

from .blocks import REPO

# manage.py commands that run inside a test (no terminal, no network); others are parsed only.
RUNNABLE_MANAGE = {"add_location", "create_token", "create_project", "apply_config",
                   "axes_reset_username"}
LOCAL_SERVER = "http://localhost:8000"


@dataclass
class Command:
    """One command of a block: ``argv`` (variables expanded), ``env`` (``NAME=value`` words set
    before it), ``source`` (its text) and ``expect`` (the ``# ...`` lines after it)."""

    argv: list[str]
    env: dict[str, str]
    source: str
    expect: list[str] = field(default_factory=list)


def split(text: str, variables: dict[str, str] | None = None) -> list[Command]:
    """The commands of a shell block. ``variables`` expand ``$NAME`` and ``${NAME}`` (shell
    expansion of the words, as bash would do it for those names)."""
    variables = variables or {}
    commands: list[Command] = []
    buffer = ""
    for line in text.splitlines():
        if not buffer and line.lstrip().startswith("#"):
            if commands:
                commands[-1].expect.append(line.lstrip()[1:].strip())
            continue
        buffer += line + "\n"
        if buffer.rstrip().endswith("\\"):
            continue
        try:
            words = shlex.split(buffer.replace("\\\n", " "), comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        source, buffer = buffer, ""
        if not words:
            continue
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        words = [_expand(w, variables) for w in words]
        commands.append(Command(words, env, source.strip()))
    assert not buffer.strip(), f"an unfinished command: {buffer!r}"
    return commands


def _expand(word: str, variables: dict[str, str]) -> str:
    def value(m):
        name = m.group(1) or m.group(2)
        assert name in variables, f"${name} is not set for this block"
        return variables[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))


def read_by_code(name: str) -> bool:
    """Whether a variable name is read somewhere in the product code or the Makefile."""
    if name in (REPO / "Makefile").read_text():
        return True
    return any(f'"{name}"' in p.read_text() for p in (REPO / "recoverydash").rglob("*.py"))


def parse_or_fail(parser, args: list[str], what: str) -> object:
    """``parser.parse_args(args)``; a usage error fails with argparse's message."""
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit as e:
        raise AssertionError(f"{what}: {args} do not parse: {err.getvalue().strip()}") from e


def example_parser(script: str):
    """The ``parse(argv)`` function of an example script (imported without running it)."""
    path = REPO / script
    assert path.is_file(), f"no script {script}"
    spec = importlib.util.spec_from_file_location(f"_doc_example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module, "parse"), f"{script} has no parse(argv)"

    class _Parser:
        def parse_args(self, args):
            return module.parse(args)

    return _Parser()


class Shell:
    """Runs or checks commands; ``server`` is the live test server's URL (for ``curl``),
    ``cwd`` the block's working folder, ``environ`` what the commands see beyond ``os.environ``."""

    def __init__(self, cwd: Path, server: str | None = None, environ: dict | None = None):
        self.cwd, self.server, self.environ = cwd, server, dict(environ or {})

    def do(self, cmd: Command) -> str:
        """Run or check ``cmd``; returns ``"ran: ..."`` or ``"checked: ..."``."""
        argv = cmd.argv
        head = os.path.basename(argv[0])
        if head == "make":
            return self.make(cmd)
        if head == "cp":
            assert (REPO / argv[1]).exists(), f"cp: no {argv[1]}"
            return f"checked: {argv[1]} exists"
        if head == "docker":
            return self.docker(argv)
        if head == "torchrun":
            return self.torchrun(argv[1:])
        if head == "curl":
            return self.curl(cmd)
        if head.startswith("python"):
            return self.python(cmd, argv[1:])
        raise AssertionError(f"no handler for the command {argv[0]!r} ({cmd.source!r}): add one "
                             "to tests/docs/commands.py")

    # -- make, docker, cp: checked -------------------------------------------------------------

    def make(self, cmd: Command) -> str:
        variables = dict(cmd.env)
        for a in cmd.argv[1:]:
            if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", a):  # make NAME=value: a make variable
                name, _, value = a.partition("=")
                variables[name] = value
        targets = [a for a in cmd.argv[1:] if not a.startswith("-") and "=" not in a]
        missing = set(targets) - makefile_targets()
        assert not missing, f"no Makefile target {sorted(missing)}"
        unread = [n for n in variables if not read_by_code(n)]
        assert not unread, f"variables read by nothing: {unread}"
        return f"checked: Makefile target(s) {', '.join(targets)}" + (
            f", variables {', '.join(variables)} read by the code" if variables else "")

    def docker(self, argv: list[str]) -> str:
        import yaml

        assert argv[1] == "compose", argv
        services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
        sub, rest = argv[2], argv[3:]
        if sub == "up":
            for a in rest:
                if a.startswith("worker=") or "=" in a:
                    assert a.split("=")[0] in services, a
            return "checked: docker compose up, services in docker-compose.yml"
        if sub == "run":
            args = [a for a in rest if a != "--rm"]
            assert args[0] in services, f"no service {args[0]}"
            assert args[1:3] == ["python", "manage.py"], args
            self.manage(args[3], args[4:], run=False)
            return f"checked: service {args[0]}, manage.py {args[3]} parses"
        raise AssertionError(f"docker compose {sub}: no check for it")

    # -- python ---------------------------------------------------------------------------------

    def python(self, cmd: Command, args: list[str]) -> str:
        if args[0] == "manage.py":
            return self.manage(args[1], args[2:], run=args[1] in RUNNABLE_MANAGE)
        if args[:2] == ["-m", "recoverydash.sdk"]:
            return self.sdk(args[2:])
        if args[:2] == ["-m", "pytest"]:
            return self.pytest(cmd, args[2:])
        if args[0].startswith("examples/"):
            parse_or_fail(example_parser(args[0]), args[1:], args[0])
            return f"checked: {args[0]} parses its arguments"
        raise AssertionError(f"python {args}: no handler")

    def manage(self, name: str, args: list[str], run: bool) -> str:
        from django.core.management import call_command, get_commands, load_command_class

        app = get_commands().get(name)
        assert app is not None, f"no manage.py command {name}"
        command = load_command_class(app, name)
        parse_or_fail(command.create_parser("manage.py", name), args, f"manage.py {name}")
        if not run:
            return f"checked: manage.py {name} parses (it needs a terminal)"
        out, err = io.StringIO(), io.StringIO()
        old = {k: os.environ.get(k) for k in self.environ}
        os.environ.update(self.environ)
        here = os.getcwd()
        try:
            os.chdir(self.cwd)
            with redirect_stdout(out):
                call_command(name, *args, stdout=out, stderr=err)
        finally:
            os.chdir(here)
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.last_output = out.getvalue()
        return f"ran: manage.py {name}"

    def sdk(self, args: list[str]) -> str:
        from recoverydash.sdk.__main__ import _parser

        ns = parse_or_fail(_parser(), args, "python -m recoverydash.sdk")
        if getattr(ns, "command", None) == "drill":
            trainer = [a for a in ns.trainer if a != "--"]
            filled = [a.format(run_id="d1-control", location="drills/d1-control", updates="8")
                      for a in trainer]
            inner = self.do(Command(filled, {}, " ".join(filled)))
            return f"checked: drill arguments parse; its command {inner[len('checked: '):]}"
        return f"checked: python -m recoverydash.sdk {args[0]} parses"

    def torchrun(self, args: list[str]) -> str:
        from torch.distributed.run import get_args_parser

        ns = parse_or_fail(get_args_parser(), args, "torchrun")
        script = ns.training_script
        parse_or_fail(example_parser(script), ns.training_script_args, script)
        return f"checked: torchrun's options and {script}'s parse"

    def pytest(self, cmd: Command, args: list[str]) -> str:
        markers = (REPO / "pyproject.toml").read_text()
        i = 0
        while i < len(args):
            a = args[i]
            if a == "-m":
                for word in re.findall(r"\w+", args[i + 1]):
                    assert word in ("not", "and", "or") or f'"{word}:' in markers, word
                i += 2
                continue
            if not a.startswith("-"):
                assert (REPO / a.split("::")[0]).exists(), f"no {a}"
            i += 1
        assert set(cmd.env) <= {"DATABASE_URL"}, cmd.env
        return "checked: pytest paths and markers exist"

    # -- curl: run against the live server -------------------------------------------------------

    def curl(self, cmd: Command) -> str:
        assert self.server, "curl needs the live test server"
        argv = [a.replace(LOCAL_SERVER, self.server) for a in cmd.argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=self.cwd,
                              env={**os.environ, **self.environ}, check=False)
        assert done.returncode == 0, done.stderr
        self.last_output = done.stdout
        if cmd.expect:
            assert json.loads(done.stdout) == json.loads(" ".join(cmd.expect)), done.stdout
        return "ran: curl against the live test server" + (
            ", the answer as the block shows it" if cmd.expect else "")


def output_matches(output: str, expect: list[str]) -> bool:
    """Whether ``output`` shows the expected lines in order: each output line begins with its
    expected line (what follows, such as a warning that depends on the machine's DNS, is
    allowed), and ``...`` stands for any number of lines."""
    pattern = r"\A" + r"\n".join(".*?" if e == "..." else re.escape(e) + r"[^\n]*"
                                  for e in expect) + r"\n?\Z"
    return re.match(pattern, output.strip(), re.DOTALL) is not None
