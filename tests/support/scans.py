"""The agent's scan, called in-process on a ProcessSet's fake device files and GPU memory: its
options (nothing protected, nothing targeted unless a test says so) and its holders by pid."""
from scripts.agent.options.record import Options


def scan_args(ps, **kw):
    fields = dict(devices=ps.glob, fake_devices=True, scope=None, scope_uid=None, protect=[], target=[],
                  match=[], fake_gpus=str(ps.memdir), max_used_mib=0, wait=0.0)
    return Options(**dict(fields, **kw))


def holders_by_pid(doc):
    return {h["pid"]: h for h in doc["holders"]}
