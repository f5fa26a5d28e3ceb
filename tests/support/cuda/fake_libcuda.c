/* STAND-IN libcuda.so.1 for tests on machines without an NVIDIA GPU.
 *
 * Exports the CUDA driver API calls the probe (scripts/agent/gpu/probe.py) makes, with the
 * real signatures, so the probe's real ctypes path is what runs. The control file named by
 * GPU_PIVOT_FAKE_CUDA (read in cuInit) says what the "driver" does, one directive a line:
 *   uuid HEX32            a device, in CUDA's order (its 16 UUID bytes as 32 hex digits)
 *   fail CALL CODE [DEV]  CALL returns CODE (on device ordinal DEV only, if given)
 *   hang CALL [DEV]       CALL never returns
 *   pause CALL READY GO   CALL creates file READY, then returns once file GO exists
 *   open PATH             cuInit opens PATH and keeps it open (a device file a scan sees)
 *   log PATH              every call is appended to PATH, one line each: "CALL DEV"
 * Built by the test with gcc; never installed, never loaded outside tests.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { char bytes[16]; } CUuuid;

#define MAXDEV 16
#define MAXRULE 32
static int ndev;
static unsigned char uuids[MAXDEV][16];
static struct { char call[64]; int code; int dev; int kind; char ready[512]; char go[512]; } rules[MAXRULE];
static int nrules;
static char logpath[512];
static __thread int current = -1;  /* the device of this thread's context */
static int inited;

static void note(const char *call, int dev) {
    if (!logpath[0]) return;
    FILE *f = fopen(logpath, "a");
    if (f) { fprintf(f, "%s %d\n", call, dev); fclose(f); }
}

/* 0, or the CUresult a rule gives CALL on DEV; a hang or pause happens here */
static CUresult rule(const char *call, int dev) {
    note(call, dev);
    for (int i = 0; i < nrules; i++) {
        if (strcmp(rules[i].call, call) || (rules[i].dev >= 0 && rules[i].dev != dev)) continue;
        if (rules[i].kind == 1) for (;;) pause();
        if (rules[i].kind == 2) {
            struct stat st;
            close(open(rules[i].ready, O_CREAT | O_WRONLY, 0600));
            while (stat(rules[i].go, &st) != 0) usleep(1000);
            continue;
        }
        return rules[i].code;
    }
    return 0;
}

static void load(void) {
    const char *path = getenv("GPU_PIVOT_FAKE_CUDA");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[1200], a[64], b[512], c[512];
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        int n = sscanf(line, "%63s %511s %511s %511s", a, b, c, c + 256);
        if (n >= 2 && !strcmp(a, "uuid") && ndev < MAXDEV) {
            for (int i = 0; i < 16; i++) sscanf(b + 2 * i, "%2hhx", &uuids[ndev][i]);
            ndev++;
        } else if (n >= 2 && !strcmp(a, "open")) {
            open(b, O_RDONLY);  /* kept open for the life of the process, as the driver keeps its fds */
        } else if (n >= 2 && !strcmp(a, "log")) {
            snprintf(logpath, sizeof logpath, "%s", b);
        } else if (nrules < MAXRULE && n >= 2 && (!strcmp(a, "fail") || !strcmp(a, "hang") || !strcmp(a, "pause"))) {
            int dev = -1, code = 0, kind = 0;
            char *rest = strchr(strchr(line, ' ') + 1, ' ');
            snprintf(rules[nrules].call, sizeof rules[nrules].call, "%s", b);
            if (!strcmp(a, "fail")) { if (rest) sscanf(rest, "%d %d", &code, &dev); }
            else if (!strcmp(a, "hang")) { kind = 1; if (rest) sscanf(rest, "%d", &dev); }
            else { kind = 2; if (rest) sscanf(rest, "%511s %511s", rules[nrules].ready, rules[nrules].go); }
            rules[nrules].code = code; rules[nrules].dev = dev; rules[nrules].kind = kind;
            nrules++;
        }
    }
    fclose(f);
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (!inited) { load(); inited = 1; }
    return rule("cuInit", -1);
}
CUresult cuDeviceGetCount(int *count) { CUresult r = rule("cuDeviceGetCount", -1); if (!r) *count = ndev; return r; }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= ndev) return 101;  /* CUDA_ERROR_INVALID_DEVICE */
    CUresult r = rule("cuDeviceGet", ordinal); if (!r) *dev = ordinal; return r;
}
static CUresult uuid_of(const char *call, CUuuid *u, CUdevice dev) {
    CUresult r = rule(call, dev); if (!r) memcpy(u->bytes, uuids[dev], 16); return r;
}
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev) { return uuid_of("cuDeviceGetUuid", u, dev); }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev) { return uuid_of("cuDeviceGetUuid_v2", u, dev); }
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    CUresult r = rule("cuCtxCreate_v2", dev); if (!r) { current = dev; *ctx = (CUcontext)(long)(dev + 1); } return r;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    CUresult r = rule("cuMemAlloc_v2", current); if (!r) *p = 0x100000ULL * (current + 1) + size * 0; return r;
}
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { (void)p; (void)v; (void)n; return rule("cuMemsetD8_v2", current); }
CUresult cuCtxSynchronize(void) { return rule("cuCtxSynchronize", current); }
CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return rule("cuMemFree_v2", current); }
CUresult cuCtxDestroy_v2(CUcontext ctx) { CUresult r = rule("cuCtxDestroy_v2", (int)(long)ctx - 1); current = -1; return r; }

static const struct { int code; const char *name, *text; } names[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
static CUresult lookup(CUresult code, const char **out, int text) {
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == code) { *out = text ? names[i].text : names[i].name; return 0; }
    *out = NULL;
    return 1;  /* CUDA_ERROR_INVALID_VALUE, as the driver answers for a code it does not know */
}
CUresult cuGetErrorName(CUresult code, const char **out) { return lookup(code, out, 0); }
CUresult cuGetErrorString(CUresult code, const char **out) { return lookup(code, out, 1); }
