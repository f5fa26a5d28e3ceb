"""ssh's own logs (`ssh -E`, one per destination in the private ControlMaster directory) do not
pile up: a call that creates a log removes ours untouched for ssh_logs.LOG_KEEP_DAYS, and
nothing else. A link, a directory, a file of another user, a file of another name, and a log
in use stay whatever their age.

Real: `invoke ping` through the loopback sshd makes the new log; the old files are made here
with old times, the other user's is chowned to a real second user (useradd).
"""
from __future__ import annotations

import os
import subprocess
import time

from scripts.reach import ssh_logs
from tests.conftest import invoke

OLD = time.time() - (ssh_logs.LOG_KEEP_DAYS + 3) * 86400


def _old(path, text=None, follow=True):
    """`path` (written with `text`, if given) with times older than the logs are kept."""
    if text is not None:
        path.write_text(text)
    os.utime(path, (OLD, OLD), follow_symlinks=follow)
    return path


def test_a_new_log_prunes_only_our_own_old_logs(sshd, hosts_env, tmp_path, monkeypatch, second_user):
    monkeypatch.setenv("GPU_PIVOT_CONTROL_DIR", str(tmp_path / "cm"))
    from scripts.reach.ssh import control_dir, control_path

    cm = control_dir()
    stale = _old(cm / "0123456789abcdef.log", "an alias long gone\n")
    recent = cm / "1111111111111111.log"
    recent.write_text("used yesterday\n")
    os.utime(recent, (time.time() - 86400,) * 2)
    theirs = cm / "2222222222222222.log"  # named as ours, owned by another user
    theirs.write_text("not ours\n")
    os.chown(theirs, second_user.uid, second_user.gid)
    _old(theirs)
    outside = _old(tmp_path / "outside.log", "a file the link points at\n")
    link = cm / "3333333333333333.log"
    link.symlink_to(outside)
    _old(link, follow=False)
    other_name = _old(cm / "notes.log", "not a name ssh_log gives\n")
    a_dir = cm / "4444444444444444.log"
    a_dir.mkdir()
    _old(a_dir)

    hosts_env(sshd.hosts_env("gpu1"))
    res = invoke("ping", "--host", "gpu1")
    assert res.returncode == 0, res.stderr.decode()
    assert not stale.exists()
    for kept in (recent, theirs, other_name, a_dir, outside):
        assert kept.exists(), kept
    assert link.is_symlink() and outside.read_text() == "a file the link points at\n"
    assert os.stat(theirs).st_uid == second_user.uid
    ours = [p for p in cm.iterdir() if p.suffix == ".log" and p not in (recent, theirs, link, other_name, a_dir)]
    assert len(ours) == 1 and time.time() - ours[0].stat().st_mtime < 600, ours  # the new one, touched now

    # a log in use is touched at each call: made old, the next call makes it young again
    try:
        _old(ours[0])
        assert invoke("ping", "--host", "gpu1").returncode == 0
        assert time.time() - ours[0].stat().st_mtime < 600
    finally:  # gpu1's master (ControlPersist) goes with the test
        opts = sshd.ssh_opts.split()
        subprocess.run(["ssh", *opts, "-o", f"ControlPath={control_path(sshd.dest(), opts)}", "-O", "exit",
                        sshd.dest()], capture_output=True, timeout=30)


def test_prune_refuses_a_directory_others_may_write(tmp_path):
    """Not our private directory (group or other may write): nothing in it is touched."""
    shared = tmp_path / "shared"
    shared.mkdir()
    log = _old(shared / "0123456789abcdef.log", "x")
    shared.chmod(0o777)
    assert ssh_logs.prune(str(shared)) == [] and log.exists()
    shared.chmod(0o700)
    assert ssh_logs.prune(str(shared)) == ["0123456789abcdef.log"] and not log.exists()
