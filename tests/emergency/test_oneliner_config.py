"""The emergency line reads the host's patterns as the agent does, or refuses them.

- ere.py's POSIX EREs match, under `grep -E`, what the host's Python regexes match (fullmatch
  for program names, search for command lines), checked on real grep;
- the script's awk gives each process the names the agent's program.names() gives it, under
  every awk this machine has (mawk, busybox awk, gawk);
- a pattern grep -E cannot express is one line and exit 2, before any line is printed;
- the script itself refuses a pattern its grep cannot read, before any signal.
"""
from __future__ import annotations

import random
import re
import shlex
import shutil
import subprocess

import pytest

from scripts.agent.policy import program, rules
from scripts.agent.wire import defaults
from scripts.emergency import ere, shell_teardown
from tests.conftest import invoke

PATTERNS = [r"sglang\.launch_server", r"vllm serve", r"sglang::.*", r"VLLM::.*", r"torchrun", r"worker\d+",
            r"[\w.-]+_exporter", r"a{,2}b", r"(?:ab|cd)+e", r"x[^\d\s]y", r"[]a]", r"[\^x]", r"[a\-z]", r"[-^]",
            r"^foo$|bar", r"\.py$", r"[.]", r"a\{2", r"a{2,3}?", r"\S+\s\S+", r"[\]\\]", r"keep-me", r"\$HOME",
            r"[x[:]+", r"a}", r"(^|/)keep-me", r"keep(-me)?( |$)", r"\W+", r"\D", r"[\s\d]+", r"(x|y)?z*?", r"\-\/\:"]
TEXTS = ["sglang.launch_server", "sglangXlaunch_server", "vllm serve", "vllm  serve", "sglang::scheduler_TP0",
         "VLLM::", "torchrun", "worker12", "worker", "node_exporter", "dcgm-exporter_exporter", "b", "aab", "aaab",
         "abcde", "abe", "xay", "x1y", "x y", "]", "a", "^", "x", "-", "z", "foo", "foobar", "bar", "run.py", ".",
         "aa{2", "aa", "aaa", "one two", "\\", "keep-me", "$HOME", "[", ":", "x}", "a}", "xx", "!!", "7", " 3",
         "", "yz", "zzz", "-/:", "python3 -m sglang.launch_server --port 1", "/usr/bin/foo bar"]
REFUSED = [r"\bvllm", r"(?i)vllm", r"(?=x)y", r"(?P<n>x)", r"(a)\1", r"x*+", r"\Avllm", r"vllm\Z", "vllmé",
           r"a{256}", r"[\D]", r"\x41", r"(|a)b", r"a$b", r"a^b", r"(^)$\.", r"x|a$*", r"(^a)+", r"(a|^b)", r"(a$|b)c"]


GREPS = [["grep"]] + ([["busybox", "grep"]] if shutil.which("busybox") else [])  # GNU, and busybox's (libc regex)


def _grep(ere_text: str, texts: list, whole: bool, grep: tuple = ("grep",)) -> set:
    """The indices of `texts` that grep -E (-x: whole line) selects with this pattern, under LC_ALL=C."""
    out = subprocess.run([*grep, "-n", "-E", *(["-x"] if whole else []), "-e", ere_text],
                         input="".join(t + "\n" for t in texts), capture_output=True, text=True,
                         env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
    assert out.returncode in (0, 1), (ere_text, out.stderr)
    return {int(line.split(":", 1)[0]) - 1 for line in out.stdout.splitlines()}


@pytest.mark.parametrize("grep", GREPS, ids=" ".join)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_each_alternative_fullmatches_as_python_does_and_the_whole_searches_alike(pattern, grep):
    for python_alt, ere_alt in ere.alternatives("GPU1_TARGETS", pattern):
        want = {i for i, t in enumerate(TEXTS) if re.fullmatch(python_alt, t)}
        assert _grep(ere_alt, TEXTS, True, grep) == want, (python_alt, ere_alt)
    whole = ere.to_ere("GPU1_PROTECT", pattern)
    assert _grep(whole, TEXTS, False, grep) == {i for i, t in enumerate(TEXTS) if re.search(pattern, t)}, whole


@pytest.mark.parametrize("pattern", REFUSED)
def test_what_ere_cannot_say_is_refused_naming_key_and_value(pattern):
    from scripts.config.errors import ConfigError, show

    with pytest.raises(ConfigError) as err:
        ere.alternatives("GPU1_PROTECT", pattern)
    assert str(err.value).startswith(f"GPU1_PROTECT={show(pattern)}: ") and "\n" not in str(err.value)


def test_the_alternatives_are_the_agents():
    for pattern in PATTERNS + list(rules.DEFAULT_TARGETS):
        assert [py for py, _ in ere.alternatives("K", pattern)] == program.alternatives(pattern), pattern


def test_the_defaults_and_generated_lines_are_the_agents():
    """The copies the script keeps (the agent's interpreter regex and protect list) are equal."""
    assert shell_teardown.DEFAULT_TARGETS == rules.DEFAULT_TARGETS
    assert shell_teardown.interpreters_line() in shell_teardown.SCRIPT.read_text().splitlines()
    assert shell_teardown.interpreters_line() == f"interp='{program.INTERPRETERS.pattern}'"
    assert "'" not in program.INTERPRETERS.pattern and "\\" not in program.INTERPRETERS.pattern  # awk -v as is


# -- the names a process goes by ------------------------------------------------------------------
def _awk_program() -> tuple:
    """(names_awk, interp) as the pasted script defines them."""
    text = shell_teardown.script_text()
    body = text.split("names_awk='", 1)[1].split("\n}'\n", 1)[0] + "\n}"
    interp = re.search(r"^interp='([^']*)'$", text, re.M).group(1)
    return body, interp


def _awks() -> list:
    found = [[a] for a in ("mawk", "gawk", "original-awk") if shutil.which(a)]
    if shutil.which("busybox"):
        found.append(["busybox", "awk"])
    return found


WORDS = ["python3", "/usr/bin/python3.11", "pypy3", "bash", "sh", "node", "perl", "-m", "-mfoo.bar", "-c", "-u",
         "-X", "dev", "-W", "--", "-", "-e", "-I", "sglang.launch_server", "sglang", "serve", "run", "/x/y/train.py",
         "a.tar.gz", ".hidden", "x.", "VLLM::EngineCore", "sglang::scheduler_TP0", "Title with space", "", " pad ",
         "x/", "UPPER", "myserve", "vllm", "torchrun", "9x", "a\tb"]
COMMS = ["python3", "bash", "myserve", "x y", "VLLM::EngineCor", ""]


def _cases(n: int = 400) -> list:
    rnd = random.Random(34)
    cases = [(["python3", "-m", "sglang.launch_server", "--port", "1"], "python3"),
             (["vllm", "serve", "m"], "vllm"), (["sglang::scheduler_TP0"], "sglang::schedul"),
             (["/usr/bin/python3", "/x/nvitop"], "nvitop"), (["torchrun", "--nproc", "8", "t.py"], "torchrun"),
             (["", "x"], "myserve"), (["  "], "")]
    for _ in range(n):
        cases.append(([rnd.choice(WORDS) for _ in range(rnd.randint(1, 5))], rnd.choice(COMMS)))
    return cases


def _listing(cases: list) -> str:
    lines = []
    for pid, (argv, comm) in enumerate(cases, start=100):
        lines.append(f"/proc/{pid}/stat:{pid} ({comm}) S {pid - 1} " + "0 " * 17 + f"{1000 + pid} 0 0")
        lines.append(f"/proc/{pid}/comm:{comm}")
        lines.append(f"/proc/{pid}/cmdline:" + "".join(a + "\x01" for a in argv))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("awk", _awks(), ids=" ".join)
def test_the_scripts_awk_names_programs_as_the_agent_does(awk):
    body, interp = _awk_program()
    cases = _cases()
    out = subprocess.run([*awk, "-v", f"interp={interp}", body], input=_listing(cases), capture_output=True,
                         text=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    got: dict = {}
    parents = {}
    for line in out.stdout.splitlines():
        pid, start, kind, name = line.split("\t")
        assert int(start) == 1000 + int(pid)
        if kind == "P":  # the parent, for the tree walk
            parents[int(pid)] = int(name)
            continue
        assert kind == ("s" if " " in name else "w")
        got.setdefault(int(pid), set()).add(name)
    assert parents == {pid: pid - 1 for pid in range(100, 100 + len(cases))}
    for pid, (argv, comm) in enumerate(cases, start=100):
        want = {name.replace("\t", "?") for name, _ in program.names({"argv": argv, "comm": comm})}
        assert got.get(pid, set()) == want, (argv, comm)


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("PROTECT", r"\bkeep"), ("TARGETS", r"(?i)vllm"), ("PROTECT", "a{300}")])
def test_oneliner_refuses_a_pattern_grep_cannot_express_before_printing_a_line(hosts_env, key, value):
    hosts_env(f"GPU1_SSH=root@192.0.2.1\nGPU2_SSH=root@192.0.2.2\nGPU2_{key}='{value}'\n")
    out = invoke("oneliner", "--host", "gpu1,gpu2", "--action", "teardown")
    err = out.stderr.decode().strip()
    assert out.returncode == 2 and out.stdout == b"", out
    assert len(err.splitlines()) == 1 and f"GPU2_{key}='{value}'" in err and "grep -E" in err, err


def test_a_hosts_patterns_are_in_the_line_it_prints(hosts_env):
    hosts_env("GPU1_SSH=root@192.0.2.1\nGPU1_PROTECT='keep\\d+'\nGPU1_TARGETS='myserve|mytool run'\n"
              "GPU1_SCOPE=/srv/jobs\nGPU1_DEVICES=/dev/nvidia[0-3]\n")
    out = invoke("oneliner", "--host", "gpu1", "--action", "teardown", "--grace", "3")
    assert out.returncode == 0, out.stderr
    remote = shlex.split(shlex.split(out.stdout.decode())[-1])  # the command ssh runs there, as its shell reads it
    assert remote[-8:] == ["/dev/nvidia[0-3]", "/srv/jobs", "", "myserve", "mytool run", "keep[0-9]+", "3",
                           str(int(defaults.SETTLE_S))]


@pytest.mark.parametrize("position, value, why", [(5, "(", "cannot read it"), (5, "x*", "matches the empty string"),
                                                  (3, "(", "cannot read it"), (2, "1a", "a uid")])
def test_the_script_refuses_what_its_grep_cannot_use_before_any_signal(ps, position, value, why):
    holder = ps.role("worker", "--gpu", "0")
    params = shell_teardown.positional(ps.glob, 1, 0, scope=str(ps.base))
    params[position] = value
    ran = subprocess.run(["sh", "-c", shell_teardown.script_text(), shell_teardown.NAME, *params],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and why in ran.stderr and "nothing was signalled" in ran.stderr, ran
    assert ran.stdout == "" and len(ran.stderr.strip().splitlines()) == 1
    from tests.support.procs import alive

    assert alive(holder)


def _random_pattern(rnd: random.Random, depth: int = 0) -> str:
    """A Python regex over a small alphabet that holds the characters ERE reads otherwise."""
    def atom() -> str:
        kind = rnd.randrange(7 if depth < 2 else 5)
        if kind == 0:
            return rnd.choice(["a", "b", "-", " ", "]", "}", "1", "_", ":"])
        if kind == 1:
            return rnd.choice([r"\.", r"\-", r"\\", r"\{", r"\^", r"\$", r"\d", r"\D", r"\s", r"\S", r"\w", r"\W", "."])
        if kind in (2, 3):
            items = [rnd.choice(["a", "b", "-", "]", "^", ".", "\\\\", "\\]", "\\-", "\\^", "[", ":", "\\d", "\\s",
                                 "\\w", "a-b", "0-9", "!-/", " "]) for _ in range(rnd.randint(1, 3))]
            return "[" + rnd.choice(["", "^"]) + "".join(items) + "]"
        if kind == 4:
            return rnd.choice(["^", "$"])
        inner = "|".join(_random_pattern(rnd, depth + 1) for _ in range(rnd.randint(1, 2)))
        return rnd.choice(["(", "(?:"]) + inner + ")"

    out = ""
    for _ in range(rnd.randint(1, 3)):
        piece = atom()
        if piece not in ("^", "$") and rnd.random() < 0.4:
            piece += rnd.choice(["*", "+", "?", "{2}", "{1,2}", "{,2}", "{2,}", "*?", "+?"])
        out += piece
    return out


@pytest.mark.parametrize("grep", GREPS, ids=" ".join)
def test_random_patterns_match_under_grep_as_under_python(grep):
    """Fuzz the translation with patterns made of what reads differently in the two dialects
    (seeds 3-13, 400-500 patterns each, passed on GNU grep 3.8 and busybox 1.35 when this was written)."""
    rnd = random.Random(3410)
    alphabet = "ab-. ]^$\\{}1_:x[!/"
    texts = sorted({"".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5))) for _ in range(300)})
    tried = 0
    while tried < 150:
        pattern = "|".join(_random_pattern(rnd) for _ in range(rnd.randint(1, 2)))
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # `[[` and friends: Python's FutureWarning, still a literal
                rx = re.compile(pattern)
            pairs = ere.alternatives("K", pattern)
        except (re.error, ere.ConfigError):
            continue
        tried += 1
        for python_alt, ere_alt in pairs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = {i for i, t in enumerate(texts) if re.fullmatch(python_alt, t)}
            assert _grep(ere_alt, texts, True, grep) == want, (pattern, python_alt, ere_alt)
        whole = "|".join(e for _, e in pairs)
        assert _grep(whole, texts, False, grep) == {i for i, t in enumerate(texts) if rx.search(t)}, (pattern, whole)
