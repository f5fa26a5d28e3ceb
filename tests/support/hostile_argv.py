"""Arguments that break quoting, and how a test sees what arrived: a route must carry every
argument byte for byte through local, ssh, sudo and pct, so the far side prints each one
NUL-terminated (`far_side`) and the test compares with what was sent (`expected`)."""

HOSTILE = ["'", '"', "$(id)", "`id`", ";", "&&", "|", "a\nb", "\t", "-n", "--", "*", "~", "ünïcødé ✓", "", " ",
           "\\", "$HOME", "!", "#x", "a'b\"c", "%s", "\\0", "{a,b}"]


def expected(argv):
    return b"".join(a.encode() + b"\0" for a in argv)


def far_side(argv):
    return ["printf", "%s\\0", *argv]
