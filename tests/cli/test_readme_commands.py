"""Every example command of the README, of the documentation pages (``docs/**/*.md``) and
of the ready configs' comments runs as written, in one directory that has the repository's
``configs/`` and ``examples/``: the README's commands and then the quickstart's first, in
the order written (as a new user types them), then every other command once. They run
through the ``ardea`` command's ``main`` (in-process, so the suite does not pay an
interpreter start per command), shortened by what :func:`shortened` appends and replaces
(two steps per stage, a tiny model and small batches; this machine's checkpoints for the
paths of full runs; a free port). No command may fail or overwrite another's run. Every
```python block of the README and the pages runs there too, as a script of its own, with
the checkpoint paths it names pointed at the shortened default run's final checkpoints."""

import ast
import json
import os
import re
import shlex
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import tinker
import yaml

import ardea.agent.server  # noqa: F401  (imported here, not by two threads at once in serve)
from ardea.cli.main import main
from ardea.config import DEFAULT_RECIPE
from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.rollout.engines.vllm.server import free_port

REPO = Path(__file__).parents[2]
#: appended to every `ardea train`: two steps, a tiny model, small batches and evaluations
SHORT_TRAIN = [
    "trainer.max_steps=2",
    "trainer.batch_size=4",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.num_threads=1",
    "data.train_size=40",
    "data.eval_size=8",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "model={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, intermediate_size: 32}",
    "logging.progress=false",
    "logging.tensorboard=false",
]
#: and to a default-recipe run, after any stage values the command gives (the RL stage's
#: early stop decides after evaluations, so it keeps some: of eight prompts, each step)
SHORT_STAGES = [
    "stages.sft.trainer.max_steps=2",
    "stages.rl.trainer.max_steps=2",
    "stages.rl.trainer.eval_every=1",
]
SHORT_EVAL = ["data.eval_size=8"]
#: a checkpoint of the (full) default recipe's run: stage, step (none for ``best``)
CHECKPOINT = re.compile(r"runs/default/(\w+)/checkpoints/(?:step_(\d+)|best)/policy")
#: a checkpoint of another ready config's run (e.g. runs/sft_arithmetic/...): its name
OTHER_RUN = re.compile(r"runs/(?!default/)(\w+)/checkpoints/step_\d+/policy")
#: a model directory the README names that this machine does not have
ELSEWHERE = "/models/Qwen2.5-0.5B-Instruct"


def commands_in(text: str, *, comment: bool = False) -> list[str]:
    """The ``ardea ...`` lines of ``text``'s bash blocks (or of its ``#   ardea`` comments)."""
    if comment:
        return [m.group(1) for m in re.finditer(r"^#\s+(ardea \S.*)$", text, re.M)]
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if without_env(line)[1].startswith("ardea ")]


#: ``NAME=value`` before a command: an environment variable set for it
ENV_PREFIX = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S+)\s+")


def without_env(command: str) -> tuple[dict[str, str], str]:
    """The environment variables a command line sets before its command, and the command."""
    env = {}
    while match := ENV_PREFIX.match(command):
        env[match.group(1)] = match.group(2)
        command = command[match.end() :]
    return env, command


#: the documentation pages, in a fixed order
DOC_PAGES = sorted((REPO / "docs").rglob("*.md"))
README_COMMANDS = commands_in((REPO / "README.md").read_text(encoding="utf-8"))
DOC_COMMANDS = [c for p in DOC_PAGES for c in commands_in(p.read_text(encoding="utf-8"))]


def unique(commands: list[str]) -> list[str]:
    """``commands`` without repeats (the same argv, whatever the spacing and comments)."""
    seen: dict[tuple[str, ...], str] = {}
    for command in commands:
        seen.setdefault(tuple(shlex.split(command, comments=True)), command)
    return list(seen.values())


def python_blocks(path: Path) -> list[tuple[str, str]]:
    """``path``'s ```python blocks as (``page:line``, code)."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(REPO)
    return [
        (f"{name}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


#: every Python snippet of the README and the pages, named by page and line
SNIPPETS = [b for p in [REPO / "README.md", *DOC_PAGES] for b in python_blocks(p)]
#: the README's and the pages' commands, each once (the README's first)
COMMANDS = unique(README_COMMANDS + DOC_COMMANDS)
CONFIG_COMMENT_COMMANDS = sorted(
    {c for p in (REPO / "configs").glob("*.yaml") for c in commands_in(p.read_text(), comment=True)}
)
#: a new user's first session: the README's commands, then the quickstart's, as written and
#: in order, repeats included
FIRST_SESSION = README_COMMANDS + commands_in((REPO / "docs" / "quickstart.md").read_text())
#: then every other page's and ready config's command, once
LATER = unique(FIRST_SESSION + COMMANDS + CONFIG_COMMENT_COMMANDS)[len(unique(FIRST_SESSION)) :]
#: `ardea train` options that print and exit: nothing is trained
PRINT_ONLY = {"--print-config", "--help-config"}
EVERY_COMMAND = {"train", "eval", "generate", "serve", "report", "tasks"}


def subcommands(commands: list[str]) -> set[str]:
    return {shlex.split(without_env(c)[1], comments=True)[1] for c in commands}


def test_the_readme_has_its_commands():
    assert shlex.split(README_COMMANDS[0], comments=True) == ["ardea", "train"]
    assert subcommands(README_COMMANDS) == EVERY_COMMAND


def test_the_docs_have_their_commands():
    assert len(DOC_PAGES) >= 20
    assert subcommands(DOC_COMMANDS) == EVERY_COMMAND
    assert len(COMMANDS) > len(README_COMMANDS)  # the pages add commands of their own
    assert len(CONFIG_COMMENT_COMMANDS) >= 3


def test_checkpoint_paths_named_are_where_the_default_recipe_ends():
    recipe = yaml.safe_load(DEFAULT_RECIPE.read_text())["stages"]
    texts = [(REPO / "README.md").read_text()] + [
        p.read_text() for p in [*DOC_PAGES, *(REPO / "configs").glob("*.yaml")]
    ]
    named = [m for text in texts for m in CHECKPOINT.finditer(text)]
    assert len(named) >= 4
    for m in named:  # each stage saves its final checkpoint at its last step; a stage that
        trainer = recipe[m.group(1)]["trainer"]  # may stop early is named by its best one
        if m.group(2) is None:
            assert trainer["keep_best"], m.group(0)
        else:
            assert int(m.group(2)) == trainer["max_steps"], m.group(0)
            assert "early_stop_target" not in trainer, m.group(0)


def test_make_run_is_ardea_train():
    recipe = re.search(r"^run:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None and recipe.group(1).strip() == ".venv/bin/ardea train"


def ardea(*argv: str, cwd: Path) -> None:
    """``ardea ARGV`` run in ``cwd``; it must succeed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert main(list(argv)) == 0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory like the repository's root, with the README's first command done:
    ``ardea train``, shortened."""
    root = tmp_path_factory.mktemp("readme")
    for name in ("configs", "examples"):
        (root / name).symlink_to(REPO / name)
    ardea("train", *SHORT_TRAIN, *SHORT_STAGES, cwd=root)
    return root


def final_policy(root: Path, stage: str) -> str:
    """The final checkpoint's policy of the shortened default run's ``stage``."""
    found = sorted((root / "runs" / "default" / stage / "checkpoints").glob("step_*"))
    return str(found[-1].relative_to(root) / "policy")


def other_policy(root: Path, run: str) -> str:
    """The final checkpoint's policy of the shortened run ``runs/RUN`` when an earlier
    command trained it, else the default run's SFT stage's (a stand-in of the same kind)."""
    found = sorted((root / "runs" / run / "checkpoints").glob("step_*"))
    return str(found[-1].relative_to(root) / "policy") if found else final_policy(root, "sft")


def shortened(command: str, root: Path) -> list[str]:
    """``command`` as argv, on this machine's models, with the shortening appended."""
    command = command.replace(ELSEWHERE, final_policy(root, "sft"))
    command = CHECKPOINT.sub(lambda m: final_policy(root, m.group(1)), command)
    command = OTHER_RUN.sub(lambda m: other_policy(root, m.group(1)), command)
    argv = [own_checkpoints(a, root) for a in shlex.split(command, comments=True)[1:]]
    if argv[0] == "eval":
        return [*argv, *SHORT_EVAL]
    if argv[0] == "serve":  # any free port: the test talks to it, then stops it
        return [*[a for a in argv if a not in ("--port", "8000")], "--port", str(free_port())]
    if argv[0] != "train":
        return argv
    staged = not any(a.endswith(".yaml") for a in argv) and "none" not in argv
    extra = SHORT_TRAIN + (SHORT_STAGES if staged else [])
    if any(a.startswith("trainer.early_stop_") for a in argv):  # it decides on evaluations
        extra.remove("trainer.eval_every=0")
    if "rollout.engine=vllm" in argv:  # the repository's vLLM, heads vLLM's CPU kernels take
        extra = [*extra, f"rollout.vllm.python={REPO / '.venv-vllm' / 'bin' / 'python'}",
                 "model={hidden_size: 64, num_layers: 1, num_heads: 2, num_kv_heads: 1}"]  # fmt: skip
    served = next((a for a in argv if a.endswith("teacher.engine=vllm")), None)
    if served:  # a teacher vLLM serves: the repository's vLLM, heads its CPU kernels take
        teacher = served.removesuffix("engine=vllm")
        extra = [*extra, f"{teacher}python={REPO / '.venv-vllm' / 'bin' / 'python'}",
                 f"{teacher}path={servable_teacher(root)}"]  # fmt: skip
    return [*argv, *extra]


def servable_teacher(root: Path) -> Path:
    """A tiny model with ardea's character tokenizer and a head dim of 32 (the shortened
    runs' 16 has no vLLM CPU kernel), written once under ``root``."""
    path = root / "servable_teacher"
    if not path.is_dir():
        tokenizer = build_char_tokenizer()
        build_tiny_model(
            tokenizer, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, seed=1
        ).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def own_checkpoints(argument: str, root: Path) -> str:
    """``argument``, or for a ready config that names the default run's checkpoints (e.g. a
    distillation teacher) a copy of it pointing at the shortened run's."""
    if not argument.endswith(".yaml") or not (root / argument).is_file():
        return argument
    text = (root / argument).read_text()
    if not CHECKPOINT.search(text):
        return argument
    copy = root / "shortened_configs" / Path(argument).name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(CHECKPOINT.sub(lambda m: final_policy(root, m.group(1)), text))
    return str(copy.relative_to(root))


def steps_trained(run_dir: Path) -> list[int]:
    """The steps each stage (or the one run) of ``run_dir`` trained, from results.json."""
    results = json.loads((run_dir / "results.json").read_text())
    return (
        [results[s]["steps"] for s in results["stages"]]
        if "stages" in results
        else [results["steps"]]
    )


def talk_then_interrupt(port: int) -> threading.Thread:
    """A client of ``ardea serve`` on ``port``: one chat request once it answers, then
    Ctrl-C (SIGINT to this process, as a terminal would send)."""

    def run():
        key = os.environ.get("ARDEA_API_KEY", "-")  # the command's key, when it sets one
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        try:
            for _ in range(600):
                try:
                    api.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "1+1="}]
                    )
                    break
                except openai.APIConnectionError:
                    time.sleep(0.1)
        finally:  # whatever happened, stop the server: the test fails on the file, not hangs
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def tinker_then_interrupt(port: int) -> threading.Thread:
    """A ``tinker`` SDK client of ``ardea serve --tinker`` on ``port``: once it answers, a
    LoRA training client that takes one step and saves its state as ``readme``; then Ctrl-C."""

    def run():
        key = os.environ.get("ARDEA_API_KEY", "tml-x")  # the command's key, when it sets one
        try:
            for _ in range(600):
                try:
                    httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz",
                              headers={"x-api-key": key}).raise_for_status()  # fmt: skip
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            url = f"http://127.0.0.1:{port}"
            with tinker.ServiceClient(base_url=url, api_key=key) as service:
                trainer = service.create_lora_training_client(base_model="tiny", rank=2).result()
                datum = tinker.types.Datum(
                    model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                    loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0, 1.0, 1.0]},
                )
                trainer.forward_backward([datum], "cross_entropy").result()
                trainer.optim_step(tinker.types.AdamParams(learning_rate=1e-3)).result()
                trainer.save_state("readme").result()
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def serve_and_talk(argv: list[str], workdir: Path) -> None:
    """Run ``ardea serve`` with a client that talks to it, then stops it with Ctrl-C; the
    OpenAI server writes one trajectory, the Tinker server keeps the client's saved state."""
    tinker_api = "--tinker" in argv
    (workdir / "trajectories.jsonl").unlink(missing_ok=True)
    shutil.rmtree(workdir / "tinker-state", ignore_errors=True)  # each command's own states
    # Ctrl-C raises KeyboardInterrupt here even when the suite was started with SIGINT
    # ignored (a background job of a shell without job control), which Python keeps
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        talk = tinker_then_interrupt if tinker_api else talk_then_interrupt
        client = talk(int(argv[-1]))
        ardea(*argv, cwd=workdir)
        client.join(timeout=30)
    finally:
        signal.signal(signal.SIGINT, previous)
    if tinker_api:
        saved = list((workdir / "tinker-state").glob("*/weights/readme/trainer_state.pt"))
        assert len(saved) == 1, saved
    else:
        assert len((workdir / "trajectories.jsonl").read_text().splitlines()) == 1


def run_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root/runs`` (path → size, modification time): what the runs hold."""
    return {
        str(p.relative_to(root / "runs")): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in (root / "runs").rglob("*")
        if p.is_file()
    }


def runs_touched(before: dict, after: dict) -> tuple[set[str], set[str]]:
    """The run directories (``runs/NAME``) a command created, and those it changed."""
    top = {path.split("/")[0] for path in before}
    changed = {path.split("/")[0] for path in before if after.get(path) != before[path]}
    return {path.split("/")[0] for path in after} - top, changed


def test_a_first_session_runs_the_readme_then_the_quickstart():
    assert FIRST_SESSION[: len(README_COMMANDS)] == README_COMMANDS
    assert len(FIRST_SESSION) > len(README_COMMANDS) and len(LATER) > 10
    assert not set(unique(FIRST_SESSION)) & set(LATER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("index", "command"),
    list(enumerate(FIRST_SESSION + LATER)),
    ids=lambda v: v if isinstance(v, int) else " ".join(shlex.split(v, comments=True)),
)
def test_example_command_runs(index, command, workdir, monkeypatch):
    env, command = without_env(command)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = shortened(command, workdir) if index else []  # the first: the fixture's own run
    before = run_files(workdir)
    if argv and argv[0] == "serve":
        serve_and_talk(argv, workdir)
    elif argv:
        ardea(*argv, cwd=workdir)
    created, changed = runs_touched(before, run_files(workdir))
    if argv and argv[0] == "train" and not PRINT_ONLY & set(argv):
        if "trainer.resume=auto" in argv:  # it continues the run it names, and only that one
            assert not created and changed <= {"default"}, (created, changed)
            written = "default"
        else:  # a new directory of its own, beside every run before it
            assert not changed and len(created) == 1, (created, changed)
            written = created.pop()
        assert set(steps_trained(workdir / "runs" / written)) == {2}
    elif argv and argv[0] == "report":  # it redraws the pictures of the run it names
        assert not created and changed <= {Path(argv[1]).name}, changed
    else:
        assert not created and not changed, (created, changed)


def test_the_docs_have_python_snippets():
    pages = {name.split(":")[0] for name, _ in SNIPPETS}
    assert "README.md" in pages and len(pages) >= 8, pages


#: ``print(EXPR)  # VALUE``: a snippet line that shows what it prints
SHOWN = re.compile(r"^(?P<indent>\s*)print\((?P<expr>.*)\)\s+#\s+(?P<value>.+)$")


def checked(code: str) -> str:
    """``code`` with every ``print(EXPR)  # VALUE`` whose VALUE is a Python literal turned
    into ``assert EXPR == VALUE``: what a page says a snippet prints is what it prints."""
    lines = []
    for line in code.splitlines():
        m = SHOWN.match(line)
        if m is not None:
            try:
                shown = ast.literal_eval(m.group("value"))
            except (ValueError, SyntaxError):
                pass  # a comment in words, e.g. "# two rows, rewards 1 and 0"
            else:
                line = f"{m['indent']}assert ({m['expr']}) == {shown!r}, ({m['expr']})"
        lines.append(line)
    return "\n".join(lines)


def test_a_shown_value_becomes_a_check():
    assert checked("print(1 + 1)  # 2") == "assert (1 + 1) == 2, (1 + 1)"
    assert checked("print(x)  # the sum") == "print(x)  # the sum"
    assert checked("print(x > 1)  # False") == "assert (x > 1) == False, (x > 1)"


@pytest.mark.slow
@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[name for name, _ in SNIPPETS])
def test_python_snippet_runs(where, code, workdir):
    code = checked(CHECKPOINT.sub(lambda m: final_policy(workdir, m.group(1)), code))
    from ardea.registry import Registry

    added = []  # what the snippet registers (a page's own loss, say): unregistered after,
    register = Registry.register  # so no other test of this process sees it

    def recording(registry, name):
        added.append((registry, name))
        return register(registry, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        patch.setattr("sys.argv", [where])
        patch.setattr(Registry, "register", recording)
        try:
            exec(compile(code, where, "exec"), {"__name__": "__main__"})
        finally:
            for registry, name in added:
                registry.unregister(name)
