"""Xid events: kernel-log lines in the format NVIDIA documents, mapped to its resolutions.

The line format comes from NVIDIA's Xid documentation ("Working with Xid Errors",
https://docs.nvidia.com/deploy/xid-errors/): `NVRM: Xid (PCI:0000:03:00): 14, Channel
00000001`, the older `NVRM: Xid (0000:03:00): ...`, and current drivers' `pid=..., name=...`
fields (the Row Remapper example `NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper:
New row marked for remapping, reset gpu to activate.`). The kernel ring buffer's own record
format (/dev/kmsg: `PRI,SEQ,USEC,FLAGS;TEXT`) is the kernel's (Documentation/ABI/testing/dev-kmsg);
the reader is run against this machine's real /dev/kmsg.
"""
import os

import pytest

from scripts.agent.gpu import health, xid

DOCUMENTED = [
    ("NVRM: Xid (PCI:0000:03:00): 14, Channel 00000001", ("0000:03:00", 14, None, "Channel 00000001")),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", ("0000:03:00", 14, None, "Channel 00000001")),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     ("0000:10:1c", 63, 1896, "Row Remapper: New row marked for remapping, reset gpu to activate.")),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     ("0000:3b:00", 79, None, "GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:9a:00): 31, pid=2254, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS",
     ("0000:9a:00", 31, 2254, "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS")),
    ("NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     ("0000:18:00", 154, None, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")),
]


@pytest.mark.parametrize("line,want", DOCUMENTED)
def test_documented_lines_parse(line, want):
    e = xid.parse_line(line)  # the text of one record: the dmesg time is cut off by parse_dmesg_line
    assert (e["bus"], e["xid"], e["pid"], e["message"]) == want
    e = xid.parse_line(xid.parse_dmesg_line("[ 8123.456789] " + line)[1])
    assert (e["bus"], e["xid"], e["pid"], e["message"]) == want
    for quoted in ("Nov 30 09:00:00 gpu-node kernel: " + line, "overlayfs: failed to resolve '/x/%s': -2" % line):
        assert xid.parse_line(quoted) is None, "NVRM: Xid must open the record's text"


def test_lines_that_are_not_xids_are_not_read_as_one():
    for line in ("NVRM: GPU at PCI:0000:03:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
                 "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04",
                 "grep 'NVRM: Xid' /var/log/messages", "NVRM: Xid (PCI:0000:03:00): , nothing"):
        assert xid.parse_line(line) is None


def test_bus_ids_from_the_log_and_from_nvml_compare_equal():
    assert xid.normalize_bus("00000000:3B:00.0") == xid.normalize_bus("0000:3b:00") == "0000:3b:00"


@pytest.mark.parametrize("number,verdict", [
    (13, "ok"), (31, "ok"), (43, "ok"), (45, "ok"), (94, "ok"),
    (48, "reset needed"), (63, "reset needed"), (64, "reset needed"), (95, "reset needed"), (119, "reset needed"),
    (74, "drain"), (79, "reboot needed"), (9999, "unknown"),
])
def test_resolution_table(number, verdict):
    got, why = xid.resolve({"xid": number, "message": ""})
    assert got == verdict and why


@pytest.mark.parametrize("action,verdict", [(0, "ok"), (1, "reset needed"), (2, "reboot needed"), (3, "drain"),
                                            (4, "drain")])
def test_xid_154_carries_the_recovery_action_it_changed_to(action, verdict):
    names = {0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P", 4: "Drain and Reset"}
    line = "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x%x (%s)" % (
        action, names[action])
    assert xid.resolve(xid.parse_line(line))[0] == verdict


def test_kmsg_and_dmesg_records_carry_their_time():
    assert xid.parse_kmsg_record("4,1234,8123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
                                 " SUBSYSTEM=pci\n") == (8123456789, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen "
                                                                     "off the bus.")
    assert xid.parse_dmesg_line("[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, x") == (
        8123456789, "NVRM: Xid (PCI:0000:3b:00): 79, x")
    assert xid.parse_kmsg_record("garbage") is None and xid.parse_dmesg_line("no time") is None


def test_xids_map_to_their_gpu_by_bus_and_an_unknown_bus_is_only_noted():
    events = [xid.parse_line("NVRM: Xid (PCI:0000:3b:00): 63, pid=1896, Row Remapper: New row marked"),
              xid.parse_line("NVRM: Xid (PCI:0000:ff:00): 79, GPU has fallen off the bus.")]
    found, elsewhere = health.xid_findings(events, {"0000:3b:00": 0, "0000:5d:00": 1}, [0, 1])
    assert [v for v, _ in found[0]] == ["reset needed"] and "pid 1896" in found[0][0][1]
    assert 1 not in found, "an Xid on a bus no listed GPU has is held against no GPU"
    assert len(elsewhere) == 1 and "PCI 0000:ff:00, not among the GPUs listed here" in elsewhere[0]
    assert "reboot needed" in elsewhere[0]
    found, elsewhere = health.xid_findings(events, {}, [0, 1])  # no bus known (fake GPUs): nothing is placed
    assert found == {} and len(elsewhere) == 2


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable (needs root)")
def test_the_real_kernel_log_is_read_and_windowed_by_time():
    """This machine's /dev/kmsg: records come back with their boot-relative time, and a window
    starting now holds none of the boot messages (nothing is written to the kernel log)."""
    events, source, error = xid.kernel_log(0)
    assert source == "/dev/kmsg" and error is None
    records = list(xid._read_kmsg("/dev/kmsg", 3.0))
    assert records and all(isinstance(us, int) for us, _ in records)
    assert records[0][0] <= xid.now_us()
    later, _, _ = xid.kernel_log(xid.now_us() + 10 ** 9)
    assert later == []
