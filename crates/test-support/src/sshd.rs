//! A real OpenSSH server on 127.0.0.1 for tests, and a stand-in compiler comma behind it.
//!
//! [`Sshd::start`] runs `/usr/sbin/sshd -D -f <temp config>` as the current user on a free high
//! port, with a throwaway host key and user key made by `ssh-keygen` in a temporary directory.
//! The client side is an ssh config file (`Sshd::ssh_config`) that names the host alias
//! [`Sshd::alias`], the key, and a private known_hosts file, so nothing ever reads or writes the
//! real `~/.ssh`.
//!
//! When sshd is not installed the tests that need it are skipped with a loud message, unless
//! `STARPILOT_REQUIRE_SSHD=1` (set by `.ci/run`), where a missing sshd fails the test instead.
//!
//! [`DeviceRoot`] is a temporary `/data`-like tree: `data/openpilot` (the remote root) with a
//! stand-in `./models` compiler written in Python, and `data/models`. The stand-in honours the
//! real compiler's flags and writes real chunk sets; files under `.standin/` make it fail in
//! chosen ways, and it logs every call to `.standin/calls.log`.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The sshd binary Debian's `openssh-server` installs.
pub const SSHD: &str = "/usr/sbin/sshd";

/// Set to `1` to make a missing sshd a test failure instead of a skip.
pub const REQUIRE_ENV: &str = "STARPILOT_REQUIRE_SSHD";

/// A running sshd on 127.0.0.1. Dropping it stops the server and removes its files.
pub struct Sshd {
    child: Child,
    dir: TempDir,
    port: u16,
    ssh_config: PathBuf,
}

impl Sshd {
    /// Start sshd, or return `None` (after printing why) when it is not installed and
    /// `STARPILOT_REQUIRE_SSHD` is not `1`. Panics on any other failure: a test that needs sshd
    /// cannot say anything useful without one.
    pub fn start() -> Option<Sshd> {
        if !Path::new(SSHD).exists() || which("ssh").is_none() || which("ssh-keygen").is_none() {
            let msg = format!(
                "{SSHD}, ssh or ssh-keygen is not installed (apt-get install -y openssh-server rsync)"
            );
            if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
                panic!("{msg}, and {REQUIRE_ENV}=1 requires it");
            }
            crate::skip::skipped(&format!("{msg}; this test needs a real sshd"));
            return None;
        }
        // A free port can be taken by someone else between our probe and sshd's bind; retry.
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_start() {
                Ok(s) => return Some(s),
                Err(e) => last = e,
            }
        }
        panic!("could not start sshd: {last}");
    }

    fn try_start() -> Result<Sshd, String> {
        let dir = tempfile::Builder::new()
            .prefix("sshd-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let d = dir.path();
        let host_key = d.join("host_ed25519");
        let user_key = d.join("user_ed25519");
        keygen(&host_key)?;
        keygen(&user_key)?;
        fs::copy(d.join("user_ed25519.pub"), d.join("authorized_keys"))
            .map_err(|e| e.to_string())?;

        let port = free_port()?;
        let user = current_user()?;
        let sshd_config = d.join("sshd_config");
        fs::write(
            &sshd_config,
            format!(
                "Port {port}\n\
                 ListenAddress 127.0.0.1\n\
                 HostKey {host}\n\
                 PidFile {pid}\n\
                 AuthorizedKeysFile {auth}\n\
                 StrictModes no\n\
                 UsePAM no\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 PubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\n\
                 AllowUsers {user}\n\
                 MaxSessions 64\n\
                 MaxStartups 64\n\
                 LogLevel ERROR\n",
                host = host_key.display(),
                pid = d.join("sshd.pid").display(),
                auth = d.join("authorized_keys").display(),
            ),
        )
        .map_err(|e| e.to_string())?;

        // sshd running as root insists on its privilege-separation directory.
        if user == "root" {
            let _ = fs::create_dir_all("/run/sshd");
        }

        let host_pub = fs::read_to_string(d.join("host_ed25519.pub")).map_err(|e| e.to_string())?;
        let mut fields = host_pub.split_whitespace();
        let (kt, kb) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        let known_hosts = d.join("known_hosts");
        fs::write(&known_hosts, format!("[127.0.0.1]:{port} {kt} {kb}\n"))
            .map_err(|e| e.to_string())?;

        let ssh_config = d.join("ssh_config");
        fs::write(
            &ssh_config,
            format!(
                "Host {alias}\n\
                 \tHostName 127.0.0.1\n\
                 \tPort {port}\n\
                 \tUser {user}\n\
                 \tIdentityFile {key}\n\
                 \tIdentitiesOnly yes\n\
                 \tUserKnownHostsFile {kh}\n\
                 \tGlobalKnownHostsFile /dev/null\n\
                 \tStrictHostKeyChecking yes\n\
                 \tBatchMode yes\n\
                 \tLogLevel ERROR\n",
                alias = Self::alias(),
                key = user_key.display(),
                kh = known_hosts.display(),
            ),
        )
        .map_err(|e| e.to_string())?;

        let log = d.join("sshd.log");
        let mut child = Command::new(SSHD)
            .arg("-D")
            .arg("-f")
            .arg(&sshd_config)
            .arg("-E")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{SSHD}: {e}"))?;

        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let text = fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("sshd exited with {status}: {text}"));
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                // sshd speaks first; a banner proves it is ours and ready.
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut buf = [0u8; 4];
                if s.read_exact(&mut buf).is_ok() && &buf == b"SSH-" {
                    break;
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "sshd did not listen on 127.0.0.1:{port} within 15 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Sshd {
            child,
            dir,
            port,
            ssh_config,
        })
    }

    /// The host alias the ssh config defines; use it as the destination.
    pub fn alias() -> &'static str {
        "starpilot-test-sshd"
    }

    /// The client ssh config (pass it as `-F`).
    pub fn ssh_config(&self) -> &Path {
        &self.ssh_config
    }

    /// A client ssh config like [`Sshd::ssh_config`] but whose known_hosts file (returned too)
    /// is empty: the server's host key is not known, as on a first connect.
    pub fn ssh_config_without_host_key(&self) -> (PathBuf, PathBuf) {
        let d = self.dir.path();
        let empty = d.join("known_hosts.empty");
        fs::write(&empty, "").expect("write empty known_hosts");
        let pinned = d.join("known_hosts").display().to_string();
        let text = fs::read_to_string(&self.ssh_config).expect("read ssh config");
        assert!(text.contains(&pinned), "the config names its known_hosts");
        let cfg = d.join("ssh_config.unpinned");
        fs::write(&cfg, text.replace(&pinned, &empty.display().to_string()))
            .expect("write ssh config");
        (cfg, empty)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding keys, configs and sshd's log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Run one command through plain `ssh` with the test config (for test assertions).
    pub fn ssh(&self, command: &str) -> std::process::Output {
        Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .arg(Self::alias())
            .arg(command)
            .stdin(Stdio::null())
            .output()
            .expect("run ssh")
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) -> Result<(), String> {
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "starpilot-test",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ssh-keygen: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn current_user() -> Result<String, String> {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .map_err(|e| format!("id -un: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A temporary device tree: `<tmp>/data/openpilot` (remote root) and `<tmp>/data/models`.
pub struct DeviceRoot {
    dir: TempDir,
}

/// The stand-in `./models`. It parses the real compiler's flags, insists on unambiguous inputs
/// (the reason staging must start from an empty directory), and writes a real chunk set whose
/// bytes depend on the tree's tinygrad marker, as a real compile does (a bump's rebuild gives
/// other artifacts than the last generation's).
const MODELS_STANDIN: &str = r#"#!/usr/bin/env python3
# Stand-in for StarPilot's ./models (scripts/model_compiler.py) used by tests.
import hashlib, os, struct, sys
root = os.path.dirname(os.path.abspath(__file__))
state = os.path.join(root, ".standin")
os.makedirs(state, exist_ok=True)
args = sys.argv[1:]
def opt(name, default=None):
    if name in args:
        i = args.index(name)
        return args[i + 1]
    return default
in_dir = opt("--input-dir", os.path.join(root, "uncompiledmodels"))
out_dir = opt("--output-dir", os.path.join(root, "compiledmodels"))
version = opt("--version", "")
fmt = opt("--input-format", "auto")
gpu = "--gpu" in args
valued = {"--input-dir", "--output-dir", "--version", "--input-format", "--model", "--chunk-size-mib"}
skip = False
dynamic = []
for a in args:
    if skip:
        skip = False
        continue
    if a in valued:
        skip = True
        continue
    if a.startswith("--") and a not in ("--gpu", "--dm", "--external-gpu", "--no-split"):
        dynamic.append(a[2:])
inputs = sorted(os.listdir(in_dir)) if os.path.isdir(in_dir) else []
with open(os.path.join(state, "calls.log"), "a") as f:
    f.write(" ".join(args) + " | inputs=" + ",".join(inputs) + "\n")
def read(name):
    try:
        with open(os.path.join(state, name)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None
# The tinygrad it builds with, where the tree records it: upstream's compiler reads the
# tinygrad_repo dependency of upstream-sync.json; the seed's tree has TINYGRAD_COMMIT.
tinygrad = read("../tinygrad_repo/TINYGRAD_COMMIT") or "?"
try:
    import json
    with open(os.path.join(root, "upstream-sync.json")) as f:
        tinygrad = [d["commit"] for d in json.load(f)["dependencies"] if d.get("path") == "tinygrad_repo"][0]
except (FileNotFoundError, ValueError, KeyError, IndexError):
    pass
print("standin compiler: tinygrad " + tinygrad, flush=True)
os.makedirs(out_dir, exist_ok=True)
if "--dm" in args:
    srcs = [n for n in inputs if n in ("dmonitoring_model.onnx", "dmonitoring.onnx", "dm.onnx")]
    if len(srcs) != 1:
        print("no driver monitoring ONNX in " + in_dir, file=sys.stderr)
        sys.exit(2)
    data = open(os.path.join(in_dir, srcs[0]), "rb").read()
    missing = read("dm_missing")
    for name in ("dmonitoring_model_tinygrad.pkl", "dmonitoring_model_metadata.pkl",
                 "dm_warp_1928x1208_tinygrad.pkl", "dm_warp_1344x760_tinygrad.pkl"):
        if name == missing:
            continue
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(b"DM:" + name.encode() + b":" + tinygrad.encode() + b":" + hashlib.sha256(data).hexdigest().encode())
        print("wrote " + name, flush=True)
    sys.exit(0)
if len(dynamic) != 1:
    print("Pass exactly one dynamic model flag, got %r" % dynamic, file=sys.stderr)
    sys.exit(2)
model = dynamic[0]
if model in (read("fail") or "").split():
    print("compile of %s failed: injected failure" % model, file=sys.stderr)
    sys.exit(3)
onnx = [n for n in inputs if n.endswith(".onnx")]
if fmt == "split":
    vision = [n for n in onnx if "vision" in n]
    policy = [n for n in onnx if "policy" in n]
    if len(vision) != 1 or len(policy) < 1 or len(vision) + len(policy) != len(onnx):
        print("ambiguous or missing split inputs in %s: %r" % (in_dir, inputs), file=sys.stderr)
        sys.exit(4)
elif len(onnx) != 1:
    print("ambiguous or missing supercombo input in %s: %r" % (in_dir, inputs), file=sys.stderr)
    sys.exit(4)
h = hashlib.sha256()
for n in sorted(onnx):
    h.update(open(os.path.join(in_dir, n), "rb").read())
# Another tinygrad compiles the same ONNX to other bytes, as the real compiler does.
seed = ("%s|%s|%s|%s|%s|" % (model, version, fmt, gpu, tinygrad)).encode() + h.digest()
size = int(read("artifact_size") or "2500")
blob = bytearray()
counter = 0
while len(blob) < size:
    blob += hashlib.sha256(seed + counter.to_bytes(4, "little")).digest()
    counter += 1
blob = bytes(blob[:size])
# Shape it as the real compiler's output: an out-of-band pickle container (8-byte LE opcode
# length, a protocol-5 opcode stream ending in STOP, then (8-byte LE length, buffer) records).
abi = read("stamp")
if abi and read("plain_pickle") != model:
    # A compiler that stamps its output (the v26 contract): the opcodes are a real pickle of a
    # dict whose plain items say which runtime can load it (the ABI, the tinygrad it was built
    # with, the format and the behaviour version), the weights one out-of-band buffer.
    import pickle
    def stamped(weights):
        return {
            "artifact_abi": abi,
            "compiler_revision": tinygrad,
            "format_version": 1,
            "behavior_version": version,
            "model_type": "vision_policy" if fmt == "split" else "supercombo",
            "image_history_pipeline": "policy",
            "frame_skip": 4,
            "execution_device": "USB+AMD:LLVM" if gpu else "QCOM",
            "warp_device": "QCOM",
            "metadata": {"input_shapes": {"input_imgs": (1, 12, 128, 256)},
                         "output_shapes": {"outputs": (1, 6504)},
                         "output_slices": {"plan": (0, 4955)}},
            (1928, 1208): {"runner": "stand-in jit"},
            (1344, 760): {"runner": "stand-in jit"},
            "weights": pickle.PickleBuffer(weights),
        }
    def dump(weights):
        bufs = []
        ops = pickle.dumps(stamped(weights), protocol=5, buffer_callback=bufs.append)
        return ops, [bytes(b.raw()) for b in bufs]
    ops, _ = dump(b"")
    ops, bufs = dump(blob[:max(size - 16 - len(ops), 1)])
    blob = struct.pack("<q", len(ops)) + ops
    for b in bufs:
        blob += struct.pack("<q", len(b)) + b
    size = len(blob)
elif read("plain_pickle") != model:
    ops = 9 if size - 17 >= 8 else size - 8
    out = struct.pack("<q", ops) + b"\x80\x05" + blob[:ops - 3] + b"."
    while len(out) < size:
        left = size - len(out)
        n = min(left - 8, 700)
        if 0 < left - 8 - n < 8:
            n = left - 8
        out += struct.pack("<q", n) + blob[len(out) + 8:len(out) + 8 + n]
    blob = out
name = model + "_driving_tinygrad.pkl"
print("compiled %s (%d bytes)" % (model, size), flush=True)
if model.startswith("local-"):
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(blob)
    sys.exit(0)
chunk = int(read("chunk_size") or "1000")
n = (size + chunk - 1) // chunk
for i in range(n):
    with open(os.path.join(out_dir, "%s.chunk%02dof%02d" % (name, i + 1, n)), "wb") as f:
        f.write(blob[i * chunk:(i + 1) * chunk])
digest = hashlib.sha256(blob).hexdigest()
if read("corrupt") == model:
    digest = hashlib.sha256(b"something else").hexdigest()
with open(os.path.join(out_dir, name + ".sha256"), "w") as f:
    f.write("%s  %s\n" % (digest, name))
with open(os.path.join(out_dir, name + ".chunkmanifest"), "w") as f:
    f.write(str(n))
print("wrote %d chunk(s)" % n, flush=True)
"#;

/// The stand-in device validator: checks the chunk set in `/data/models` and prints a JSON
/// verdict as its last line, like `scripts/validate_model_artifact.py`, with one result per
/// camera resolution (`resolutions."<W>x<H>"`: `passed` and `finite.<output>`, the contract
/// docs/release.md describes). The `nonfinite` knob (`<W>x<H> <output>`) makes that output
/// non-finite at that resolution; the `p95_ms` knob is the p95 inference latency the device
/// measured, reported as upstream's v26 validator (`scripts/validate_driving_model.py`) reports
/// it: `cameras[i].inference_ms.p95` per camera (absent without the knob), and a camera over
/// the `--max-p95-ms` bound given fails with an `error` and no timings, as upstream's does.
const VALIDATOR_STANDIN: &str = r#"#!/usr/bin/env python3
import hashlib, json, os, sys
args = sys.argv[1:]
model = args[args.index("--model") + 1]
version = args[args.index("--version") + 1]
bound = float(args[args.index("--max-p95-ms") + 1]) if "--max-p95-ms" in args else None
os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".standin"), exist_ok=True)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".standin", "validate.log"), "a") as f:
    f.write(" ".join(args) + "\n")
here = os.path.dirname(os.path.abspath(__file__))
models = os.path.join(here, "..", "..", "models")
knob = os.path.join(here, "..", ".standin", "nonfinite")
bad = open(knob).read().split() if os.path.exists(knob) else []
p95 = os.path.join(here, "..", ".standin", "p95_ms")
latency = float(open(p95).read()) if os.path.exists(p95) else None
name = model + "_driving_tinygrad.pkl"
print("validating " + name, flush=True)
try:
    n = int(open(os.path.join(models, name + ".chunkmanifest")).read().strip())
    h = hashlib.sha256()
    for i in range(n):
        h.update(open(os.path.join(models, "%s.chunk%02dof%02d" % (name, i + 1, n)), "rb").read())
    ok = open(os.path.join(models, name + ".sha256")).read().split()[0] == h.hexdigest()
    res = {}
    for r in ("1928x1208", "1344x760"):
        finite = {o: ok and bad != [r, o] for o in ("plan", "lane_lines", "road_edges", "lead", "pose", "action")}
        res[r] = {"passed": all(finite.values()), "finite": finite}
    cameras = []
    if latency is not None:
        for r in ("1928x1208", "1344x760"):
            camera = [int(x) for x in r.split("x")]
            if bound is not None and latency > bound:
                cameras.append({"passed": False, "camera": camera,
                                "error": "ValueError: p95 latency %.2f ms exceeds %.2f ms" % (latency, bound)})
            else:
                cameras.append({"passed": res[r]["passed"], "camera": camera,
                                "inference_ms": {"min": latency / 2, "median": latency * 0.8, "p95": latency, "max": latency * 1.1}})
    passed = all(v["passed"] for v in res.values()) and all(c["passed"] for c in cameras)
    verdict = {"model": model, "version": version, "passed": passed, "artifact_sha256": h.hexdigest(), "resolutions": res}
    if cameras:
        verdict["cameras"] = cameras
    print(json.dumps(verdict))
except FileNotFoundError as e:
    print(json.dumps({"model": model, "version": version, "passed": False, "error": str(e)}))
"#;

impl DeviceRoot {
    /// Make the tree, install the stand-ins, and write `commit` as the device's tinygrad marker
    /// (`None`: no marker, as on a fresh device).
    pub fn new(commit: Option<&str>) -> DeviceRoot {
        let dir = tempfile::Builder::new()
            .prefix("device-")
            .tempdir()
            .expect("tempdir");
        let d = DeviceRoot { dir };
        let root = d.remote_root();
        fs::create_dir_all(root.join("tinygrad_repo")).unwrap();
        fs::create_dir_all(root.join("scripts")).unwrap();
        fs::create_dir_all(d.models_dir()).unwrap();
        write_exec(&root.join("models"), MODELS_STANDIN);
        write_exec(
            &root.join("scripts/validate_model_artifact.py"),
            VALIDATOR_STANDIN,
        );
        if let Some(c) = commit {
            fs::write(root.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{c}\n")).unwrap();
        }
        d
    }

    /// `<tmp>/data/openpilot`, the `--remote-root`.
    pub fn remote_root(&self) -> PathBuf {
        self.dir.path().join("data/openpilot")
    }

    /// `<tmp>/data/models`.
    pub fn models_dir(&self) -> PathBuf {
        self.dir.path().join("data/models")
    }

    /// A knob file under `.standin/` (`fail`, `corrupt`, `dm_missing`, `chunk_size`,
    /// `artifact_size`, `nonfinite`, `p95_ms`; `stamp`: the ABI a stamping compiler names, which
    /// makes every driving artifact a real pickle of a dict carrying the stamp, its
    /// `compiler_revision` the comma's tinygrad marker and its `behavior_version` the
    /// `--version` given).
    pub fn set(&self, knob: &str, value: &str) {
        let state = self.remote_root().join(".standin");
        fs::create_dir_all(&state).unwrap();
        fs::write(state.join(knob), value).unwrap();
    }

    pub fn clear(&self, knob: &str) {
        let _ = fs::remove_file(self.remote_root().join(".standin").join(knob));
    }

    /// Every validator call so far, its arguments one line each.
    pub fn validator_calls(&self) -> Vec<String> {
        fs::read_to_string(self.remote_root().join(".standin/validate.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Every `./models` call so far, one line each: `<args> | inputs=<staged files>`.
    pub fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.remote_root().join(".standin/calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn write_exec(path: &Path, text: &str) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    drop(f);
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}
