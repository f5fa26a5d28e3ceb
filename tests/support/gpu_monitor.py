"""A GPU monitor that only holds an NVML handle (like fixture PID 780), for the GPU tests."""
import sys
import time

import pynvml

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
open(sys.argv[1], "w").write(str(count))
while True:
    for i in range(count):
        pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
    time.sleep(0.5)
