"""What the tests share: real processes and hosts to test against (procs, scenario, loopback
sshd, a second user, PID namespaces, real systemd/docker/Proxmox-like hosts, a Slurm
cluster), the programs tests start by path (gpu_tree.py, hung_fuse.py, standin/), and the
parsers only tests use. The test files themselves mirror scripts/ in the folders beside this."""
