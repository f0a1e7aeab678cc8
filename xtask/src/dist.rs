//! `cargo xtask dist [--reproducible] [--test]`: the device binary for the comma.
//!
//! Builds `device-modeld-manager` for `aarch64-unknown-linux-gnu` against glibc 2.31 (AGNOS is
//! Ubuntu 20.04) into `target/dist/` (the binary and a `sha256sum -c` file), from the package
//! registries alone:
//!
//! - Debian's `rustc-web`/`cargo-web` (>= 1.95, bookworm-security has 1.96) as the compiler, with
//!   the aarch64 std of exactly that version unpacked from the arm64 `libstd-rust-web-dev` .deb
//!   into a private sysroot (rustup cannot add targets here, and rustup's compiler refuses a std
//!   built by another rustc);
//! - `cargo-zigbuild` + `ziglang` from PyPI, pinned, in a private venv: zig is the C compiler for
//!   `ring` and the linker, and links against glibc 2.31's symbol versions;
//! - for `--test`, `qemu-user-static` and Debian bullseye's arm64 `libc6` (glibc 2.31) unpacked as
//!   the emulator's `-L` root, so the binary runs against the C library a comma has.
//!
//! Everything is installed when missing and skipped when present; downloads and unpacked trees
//! are cached under `target/dist-tools/`, each made under a temporary name and renamed when
//! complete, so an interrupted run never leaves a half-made tree that a later run trusts.
//!
//! The build is reproducible: paths of the checkout, the target directory and the cargo home are
//! remapped, symbols are stripped, and `--reproducible` proves it by building twice from clean
//! target directories, the second time from a copy of the tree in another directory, and
//! comparing bytes. The binary's highest `GLIBC_` symbol version is printed, and the build fails
//! above 2.31.
//!
//! `--test` plays the workspace's end-to-end story (`tests/tests/end_to_end.rs`: v24 device ->
//! refresh -> verified v25 install, Hugging Face down, selected model missing) with the aarch64
//! binary under `qemu-aarch64-static` against `release-cli serve` on the host, through the
//! story's `STARPILOT_DEVICE_BIN` / `STARPILOT_DEVICE_RUNNER` hook; then the hashing story
//! (`dist_hash.rs`): the same artifact installed and verified on a CPU with the ARMv8 SHA-2
//! instructions and on one without, `status -v` naming the backend. Every build checks that the
//! binary contains those instructions (`aarch64-linux-gnu-objdump -d`).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::util;

pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// AGNOS (Ubuntu 20.04) ships glibc 2.31: no symbol may need a newer one.
pub const GLIBC_CEILING: GlibcVersion = GlibcVersion(2, 31, 0);
pub const BIN: &str = "device-modeld-manager";
/// The oldest Debian rustc that accepts the workspace (its `rust-version`).
const MIN_RUSTC: (u32, u32) = (1, 95);
/// Pinned, so that a rebuild next month links with the same zig.
const PIP_PINS: [&str; 2] = ["ziglang==0.17.1", "cargo-zigbuild==0.24.1"];
/// The comma 3/3X's cores are Cortex-A55 (ARMv8.2); emulate the older ARMv8.0 + crypto
/// Cortex-A53 so that the binary is shown not to need anything newer.
pub const QEMU_CPU: &str = "cortex-a53";
const QEMU: &str = "/usr/bin/qemu-aarch64-static";
/// Where the remapped paths point in the binary (panic messages, if any, name these).
const REMAP_SOURCE: &str = "/starpilot-models";
const REMAP_TARGET: &str = "/starpilot-models/target";
const REMAP_CARGO_HOME: &str = "/cargo";

/// A glibc symbol version such as `GLIBC_2.17` (patch level for `GLIBC_2.3.4` and the like).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GlibcVersion(pub u32, pub u32, pub u32);

impl fmt::Display for GlibcVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.2 {
            0 => write!(f, "GLIBC_{}.{}", self.0, self.1),
            p => write!(f, "GLIBC_{}.{}.{p}", self.0, self.1),
        }
    }
}

/// The highest `GLIBC_x.y[.z]` named in `readelf -V` output (version needs and per-symbol
/// versions alike); `GLIBC_PRIVATE` and other non-numeric names are not versions.
pub fn max_glibc(readelf_v: &str) -> Option<GlibcVersion> {
    let mut best = None;
    let mut rest = readelf_v;
    while let Some(pos) = rest.find("GLIBC_") {
        rest = &rest[pos + "GLIBC_".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let mut parts = rest[..end].split('.').map(|p| p.parse::<u32>());
        let v = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Ok(a)), Some(Ok(b)), None, None) => GlibcVersion(a, b, 0),
            (Some(Ok(a)), Some(Ok(b)), Some(Ok(c)), None) => GlibcVersion(a, b, c),
            _ => continue,
        };
        best = best.max(Some(v));
    }
    best
}

/// What `readelf -h` says the machine is (`AArch64`, `Advanced Micro Devices X86-64`, ...).
pub fn elf_machine(readelf_h: &str) -> Option<&str> {
    readelf_h.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "Machine").then(|| v.trim())
    })
}

/// `1.96.0+dfsg1-1~deb12u2` -> (1, 96): the upstream major and minor of a Debian rustc version.
pub fn rustc_minor(debian_version: &str) -> Option<(u32, u32)> {
    let upstream = debian_version
        .split_once(':')
        .map_or(debian_version, |(_, v)| v);
    let mut it = upstream.split(['.', '+', '-', '~']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The Debian archive URIs the machine already uses (`…/debian` and `…/debian-security`), from
/// one-line or deb822 sources; deb.debian.org when none is found.
pub fn debian_archives(sources: &str) -> (String, String) {
    let mut main = None;
    let mut security = None;
    for word in sources.split_whitespace() {
        let uri = word.trim_end_matches('/');
        if !(uri.starts_with("http://") || uri.starts_with("https://")) {
            continue;
        }
        if uri.ends_with("/debian-security") {
            security.get_or_insert_with(|| uri.to_string());
        } else if uri.ends_with("/debian") {
            main.get_or_insert_with(|| uri.to_string());
        }
    }
    (
        main.unwrap_or_else(|| "http://deb.debian.org/debian".into()),
        security.unwrap_or_else(|| "http://deb.debian.org/debian-security".into()),
    )
}

struct Opts {
    test: bool,
    reproducible: bool,
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut opts = Opts {
        test: false,
        reproducible: false,
    };
    for a in args {
        match a.as_str() {
            "--test" => opts.test = true,
            "--reproducible" => opts.reproducible = true,
            other => {
                return Err(format!(
                    "dist: unknown argument {other:?} (expected --test and/or --reproducible)"
                ));
            }
        }
    }
    let start = Instant::now();
    let tools = Tools::ensure(opts.test)?;
    let root = util::root();
    let build_root = util::target_dir().join("dist-build");

    let (bin, digest) = if opts.reproducible {
        // Two clean builds: one from the checkout, one from a copy of it elsewhere.
        let a = build_root.join("a-target");
        let b = build_root.join("b-target");
        let b_src = build_root.join("b-src");
        for d in [&a, &b, &b_src] {
            remove_dir(d)?;
        }
        let first = tools.build(&root, &a)?;
        eprintln!(
            "dist: copying the tree to {} for the second build",
            b_src.display()
        );
        copy_tree(&root, &b_src)?;
        let second = tools.build(&b_src, &b)?;
        let (da, db) = (sha256_file(&first)?, sha256_file(&second)?);
        if da != db {
            return Err(format!(
                "the build is not reproducible: {} has sha256 {da}, {} has {db}; compare them \
                 with `cmp -l` or diffoscope",
                first.display(),
                second.display()
            ));
        }
        eprintln!("dist: two clean builds from two directories are identical (sha256 {da})");
        remove_dir(&b_src)?;
        remove_dir(&b)?;
        (first, da)
    } else {
        let bin = tools.build(&root, &build_root.join("a-target"))?;
        let d = sha256_file(&bin)?;
        (bin, d)
    };

    let glibc = check_binary(&bin)?;
    check_sha2_instructions(&bin)?;
    let out = publish(&bin, &digest)?;
    println!(
        "{} ({} bytes, sha256 {digest}, needs {glibc}, ceiling {GLIBC_CEILING})",
        out.display(),
        fs::metadata(&out).map_err(|e| e.to_string())?.len()
    );
    if opts.test {
        tools.test(&out)?;
    }
    eprintln!("dist: done in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// `target/dist/device-modeld-manager` and its `.sha256`, each written under a temporary name
/// and renamed, the checksum last.
fn publish(bin: &Path, digest: &str) -> Result<PathBuf, String> {
    let dist = util::target_dir().join("dist");
    fs::create_dir_all(&dist).map_err(|e| format!("{}: {e}", dist.display()))?;
    let out = dist.join(BIN);
    let sum = dist.join(format!("{BIN}.sha256"));
    let _ = fs::remove_file(&sum);
    let tmp = dist.join(format!(".{BIN}.tmp"));
    fs::copy(bin, &tmp).map_err(|e| format!("{} -> {}: {e}", bin.display(), tmp.display()))?;
    fs::rename(&tmp, &out).map_err(|e| format!("{}: {e}", out.display()))?;
    let tmp = dist.join(format!(".{BIN}.sha256.tmp"));
    fs::write(&tmp, format!("{digest}  {BIN}\n")).map_err(|e| format!("{}: {e}", tmp.display()))?;
    fs::rename(&tmp, &sum).map_err(|e| format!("{}: {e}", sum.display()))?;
    Ok(out)
}

/// Checks the ELF machine and the glibc ceiling; prints what the binary needs.
fn check_binary(bin: &Path) -> Result<GlibcVersion, String> {
    let header = output(Command::new("readelf").arg("-h").arg(bin))?;
    match elf_machine(&header) {
        Some("AArch64") => {}
        other => {
            return Err(format!(
                "{} is not an AArch64 ELF (readelf -h says machine {other:?})",
                bin.display()
            ));
        }
    }
    let versions = output(Command::new("readelf").args(["-V", "--wide"]).arg(bin))?;
    let max = max_glibc(&versions).ok_or_else(|| {
        format!(
            "{} names no GLIBC_ version (readelf -V); is it linked against glibc?",
            bin.display()
        )
    })?;
    let dynamic = output(Command::new("readelf").args(["-d", "--wide"]).arg(bin))?;
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    eprintln!(
        "dist: {} needs {} and at most {max}",
        bin.display(),
        needed.join(", ")
    );
    if max > GLIBC_CEILING {
        return Err(format!(
            "{} needs {max}, newer than AGNOS's glibc ({GLIBC_CEILING}); `readelf -V --wide {}` \
             shows which symbol; the build must link against glibc 2.31 (cargo-zigbuild target \
             suffix .2.31)",
            bin.display(),
            bin.display()
        ));
    }
    Ok(max)
}

/// The ARMv8 SHA-2 instructions SHA-256 needs; `sha2`'s aarch64 backend uses all four.
pub const SHA2_INSTRUCTIONS: [&str; 4] = ["sha256h", "sha256h2", "sha256su0", "sha256su1"];

/// Which of [`SHA2_INSTRUCTIONS`] a disassembly (`objdump -d`) never uses. Pure.
pub fn missing_sha2_instructions(disassembly: &str) -> Vec<&'static str> {
    let mut seen = [false; SHA2_INSTRUCTIONS.len()];
    for line in disassembly.lines() {
        // `  4f2a1c:\t5e004020 \tsha256h\tq0, q1, v2.4s`: the mnemonic is the first word after
        // the address and the encoding.
        let Some(mnemonic) = line
            .split('\t')
            .map(str::trim)
            .find(|w| w.starts_with("sha256"))
        else {
            continue;
        };
        let mnemonic = mnemonic.split_whitespace().next().unwrap_or("");
        if let Some(i) = SHA2_INSTRUCTIONS.iter().position(|m| *m == mnemonic) {
            seen[i] = true;
        }
    }
    SHA2_INSTRUCTIONS
        .iter()
        .zip(seen)
        .filter(|(_, s)| !s)
        .map(|(m, _)| *m)
        .collect()
}

/// The binary hashes with the comma's SHA-2 instructions when the CPU has them: each of them
/// is in its code (`aarch64-linux-gnu-objdump -d`). Whether they run is decided at run time
/// (`status -v` names the backend; `--test` shows both).
fn check_sha2_instructions(bin: &Path) -> Result<(), String> {
    let out = Command::new("aarch64-linux-gnu-objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(bin)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| {
            format!("cannot run aarch64-linux-gnu-objdump: {e} (apt-get install binutils-aarch64-linux-gnu)")
        })?;
    if !out.status.success() {
        return Err(format!(
            "aarch64-linux-gnu-objdump -d {} failed",
            bin.display()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let missing = missing_sha2_instructions(&text);
    if !missing.is_empty() {
        return Err(format!(
            "{} has no {} instruction: its SHA-256 would run the portable code on the comma; \
             sha2 needs its `asm` feature on aarch64 (crates/chunker/Cargo.toml)",
            bin.display(),
            missing.join("/")
        ));
    }
    eprintln!(
        "dist: {} uses the ARMv8 SHA-2 instructions ({}) when the CPU has them",
        bin.display(),
        SHA2_INSTRUCTIONS.join(", ")
    );
    Ok(())
}

/// The installed toolchain and the caches under `target/dist-tools`.
struct Tools {
    dir: PathBuf,
    venv: PathBuf,
    sysroot: PathBuf,
    rustc_version: String,
    /// bullseye's arm64 libc6, unpacked (only with --test).
    glibc_root: Option<PathBuf>,
}

impl Tools {
    fn ensure(test: bool) -> Result<Self, String> {
        if !Path::new("/etc/debian_version").is_file() {
            return Err(
                "dist installs its toolchain with apt and needs Debian (bookworm or newer); \
                 on another system install rustc 1.95+ with an aarch64 std, cargo-zigbuild and \
                 zig by hand"
                    .into(),
            );
        }
        let dir = util::target_dir().join("dist-tools");
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // binutils-aarch64-linux-gnu: an objdump that reads the aarch64 binary (the host's
        // cannot), to show the ARMv8 SHA-2 instructions are in it.
        let mut pkgs = vec![
            "rustc-web",
            "cargo-web",
            "binutils",
            "binutils-aarch64-linux-gnu",
            "python3-venv",
        ];
        if test {
            pkgs.push("qemu-user-static");
        }
        apt_install(&pkgs)?;
        let mut rustc_version = dpkg_version("rustc-web").ok_or("rustc-web did not install")?;
        if rustc_minor(&rustc_version).is_none_or(|v| v < MIN_RUSTC) {
            // Installed from stale package lists (bookworm main has 1.85): refresh them and
            // upgrade once before giving up.
            eprintln!("dist: rustc-web {rustc_version} is too old; apt-get update and upgrade");
            run_ok(&mut apt_get(&["update"]))?;
            run_ok(&mut apt_get(&[
                "install",
                "-y",
                "--no-install-recommends",
                "rustc-web",
                "cargo-web",
            ]))?;
            rustc_version = dpkg_version("rustc-web").ok_or("rustc-web did not install")?;
        }
        match rustc_minor(&rustc_version) {
            Some(v) if v >= MIN_RUSTC => {}
            _ => {
                return Err(format!(
                    "rustc-web {rustc_version} is older than {}.{} (the workspace's \
                     rust-version); on bookworm the newer one comes from bookworm-security: \
                     add it to the apt sources and run `apt-get update`",
                    MIN_RUSTC.0, MIN_RUSTC.1
                ));
            }
        }
        let apt = PrivateApt::new(&dir)?;
        let std_dir = apt.unpacked("libstd-rust-web-dev", Some(&rustc_version))?;
        let std_lib = std_dir.join(format!("usr/lib/rustlib/{TARGET}"));
        if !std_lib.join("lib").is_dir() {
            return Err(format!(
                "{} has no aarch64 std (expected {}); delete {} and run again",
                std_dir.display(),
                std_lib.display(),
                std_dir.display()
            ));
        }
        let sysroot = make_sysroot(&dir, &rustc_version, &std_lib)?;
        let venv = ensure_venv(&dir)?;
        let glibc_root = if test {
            let root = apt.unpacked_bullseye_libc()?;
            Some(root)
        } else {
            None
        };
        Ok(Tools {
            dir,
            venv,
            sysroot,
            rustc_version,
            glibc_root,
        })
    }

    /// One release build of the device binary from the workspace at `src` into `target_dir`.
    fn build(&self, src: &Path, target_dir: &Path) -> Result<PathBuf, String> {
        for p in [src, target_dir, &self.sysroot] {
            if p.to_string_lossy().contains(char::is_whitespace) {
                return Err(format!(
                    "{} contains whitespace, which cargo's space-separated RUSTFLAGS cannot \
                     carry; move the checkout (or CARGO_TARGET_DIR) to a path without spaces",
                    p.display()
                ));
            }
        }
        let cargo_home = cargo_home();
        // Later remaps win: the target dir sits inside the checkout.
        let rustflags = [
            format!("--sysroot={}", self.sysroot.display()),
            format!(
                "--remap-path-prefix={}={REMAP_CARGO_HOME}",
                cargo_home.display()
            ),
            format!("--remap-path-prefix={}={REMAP_SOURCE}", src.display()),
            format!(
                "--remap-path-prefix={}={REMAP_TARGET}",
                target_dir.display()
            ),
            "-Cstrip=symbols".to_string(),
        ]
        .join(" ");
        let path = std::env::join_paths([self.venv.join("bin")].into_iter().chain(
            ["/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from),
        ))
        .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(self.venv.join("bin/cargo-zigbuild"));
        // Start from the caller's environment without anything that would steer the build to
        // rustup's toolchain or add flags (cargo run sets CARGO_*, rustup sets RUSTUP_TOOLCHAIN).
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if (k.starts_with("CARGO") && k != "CARGO_HOME")
                || k.starts_with("RUSTC")
                || k.starts_with("RUSTDOC")
                || k.starts_with("RUSTUP")
                || k == "RUSTFLAGS"
            {
                cmd.env_remove(&k);
            }
        }
        let zig_cache = self.dir.join("zig-cache");
        cmd.current_dir(src)
            .env("PATH", path)
            .env("CARGO", "/usr/bin/cargo")
            .env("RUSTC", "/usr/bin/rustc")
            .env("RUSTDOC", "/usr/bin/rustdoc")
            .env("CARGO_HOME", &cargo_home)
            .env("CARGO_TARGET_DIR", target_dir)
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                &rustflags,
            )
            .env("CARGO_INCREMENTAL", "0")
            .env("ZIG_GLOBAL_CACHE_DIR", &zig_cache)
            .env("ZIG_LOCAL_CACHE_DIR", &zig_cache)
            .env("SOURCE_DATE_EPOCH", "0")
            .args(["zigbuild", "--release", "--locked", "-p", BIN, "--target"])
            .arg(format!("{TARGET}.{}.{}", GLIBC_CEILING.0, GLIBC_CEILING.1));
        eprintln!(
            "dist: building {BIN} for {TARGET} (glibc {}.{}) with rustc {} in {} -> {}",
            GLIBC_CEILING.0,
            GLIBC_CEILING.1,
            self.rustc_version,
            src.display(),
            target_dir.display()
        );
        let start = Instant::now();
        let status = cmd.status().map_err(|e| {
            format!(
                "cannot run {}: {e}",
                self.venv.join("bin/cargo-zigbuild").display()
            )
        })?;
        if !status.success() {
            return Err(format!(
                "cargo zigbuild failed ({status}) in {}; the output above says why",
                src.display()
            ));
        }
        eprintln!("dist: built in {:.0} s", start.elapsed().as_secs_f64());
        let bin = target_dir.join(TARGET).join("release").join(BIN);
        if !bin.is_file() {
            return Err(format!(
                "cargo zigbuild succeeded but {} is missing",
                bin.display()
            ));
        }
        Ok(bin)
    }

    /// The end-to-end story with `bin` under qemu against `release-cli serve` on the host.
    fn test(&self, bin: &Path) -> Result<(), String> {
        let glibc_root = self
            .glibc_root
            .as_ref()
            .ok_or("internal: the glibc 2.31 root was not prepared")?;
        let qemu = |args: &[&str]| {
            let mut c = Command::new(QEMU);
            c.env("QEMU_LD_PREFIX", glibc_root)
                .env("QEMU_CPU", QEMU_CPU)
                .arg(bin)
                .args(args);
            c
        };
        let version = output(&mut qemu(&["--version"]))?;
        eprintln!(
            "dist: under {QEMU} -cpu {QEMU_CPU} -L {}: {}",
            glibc_root.display(),
            version.trim()
        );
        if !version.starts_with(BIN) {
            return Err(format!(
                "{bin:?} --version under qemu printed {version:?}, not `{BIN} <version>`"
            ));
        }
        // The host side of the story: release-cli (publish, serve) and the test driver are
        // built by the usual toolchain; only the device binary is swapped.
        util::cargo(&[
            "build",
            "--locked",
            "-p",
            "release-cli",
            "-p",
            "test-support",
        ])?;
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let args = [
            "test",
            "--locked",
            "-p",
            "integration-tests",
            "--test",
            "end_to_end",
            "--",
            "--nocapture",
        ];
        eprintln!(
            "$ STARPILOT_DEVICE_BIN={} STARPILOT_DEVICE_RUNNER={QEMU} QEMU_LD_PREFIX={} \
             QEMU_CPU={QEMU_CPU} cargo {}",
            bin.display(),
            glibc_root.display(),
            args.join(" ")
        );
        let status = Command::new(&cargo)
            .args(args)
            .current_dir(util::root())
            .env("STARPILOT_DEVICE_BIN", bin)
            .env("STARPILOT_DEVICE_RUNNER", QEMU)
            .env("QEMU_LD_PREFIX", glibc_root)
            .env("QEMU_CPU", QEMU_CPU)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "the end-to-end story failed with the aarch64 binary under qemu ({status})"
            ));
        }
        eprintln!("dist: the end-to-end story passed with the aarch64 binary under qemu");
        let story = Instant::now();
        let python = self.venv.join("bin/python3");
        crate::dist_hash::run(
            Path::new(QEMU),
            glibc_root,
            bin,
            QEMU_CPU,
            &mut || {
                let mut c = Command::new(&python);
                c.args(["-m", "ziglang"])
                    .env("ZIG_GLOBAL_CACHE_DIR", self.dir.join("zig-cache"))
                    .env("ZIG_LOCAL_CACHE_DIR", self.dir.join("zig-cache"));
                c
            },
            &util::target_dir().join("debug"),
            &util::target_dir().join("dist-hash-story"),
        )?;
        eprintln!(
            "dist: the hashing story passed with and without the SHA-2 instructions in {:.0} s",
            story.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

/// `lib/rustlib/<host>` linked to Debian's host std and `lib/rustlib/<aarch64>` to the unpacked
/// one, remade when the rustc version changes.
fn make_sysroot(dir: &Path, rustc_version: &str, std_lib: &Path) -> Result<PathBuf, String> {
    let sysroot = dir.join(format!("sysroot-{}", sanitize(rustc_version)));
    let host = "x86_64-unknown-linux-gnu";
    let rustlib = sysroot.join("lib/rustlib");
    if rustlib.join(TARGET).exists() && rustlib.join(host).exists() {
        return Ok(sysroot);
    }
    let tmp = dir.join(format!(".sysroot-{}.tmp", sanitize(rustc_version)));
    remove_dir(&tmp)?;
    let tmp_rustlib = tmp.join("lib/rustlib");
    fs::create_dir_all(&tmp_rustlib).map_err(|e| format!("{}: {e}", tmp_rustlib.display()))?;
    let link = |to: &Path, name: &str| {
        std::os::unix::fs::symlink(to, tmp_rustlib.join(name))
            .map_err(|e| format!("{}: {e}", tmp_rustlib.join(name).display()))
    };
    link(&PathBuf::from(format!("/usr/lib/rustlib/{host}")), host)?;
    link(std_lib, TARGET)?;
    remove_dir(&sysroot)?;
    fs::rename(&tmp, &sysroot).map_err(|e| format!("{}: {e}", sysroot.display()))?;
    Ok(sysroot)
}

/// The venv with the pinned zig and cargo-zigbuild; a stamp written last marks it complete.
fn ensure_venv(dir: &Path) -> Result<PathBuf, String> {
    let venv = dir.join("venv");
    let stamp = venv.join(".xtask-pins");
    let pins = PIP_PINS.join("\n");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(pins.as_str())
        && venv.join("bin/cargo-zigbuild").is_file()
    {
        return Ok(venv);
    }
    remove_dir(&venv)?;
    eprintln!(
        "dist: creating {} with {}",
        venv.display(),
        PIP_PINS.join(" ")
    );
    run_ok(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv),
    )?;
    run_ok(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(PIP_PINS)
            // pip's cache stays with the venv's other downloads, under target/.
            .env("PIP_CACHE_DIR", dir.join("pip-cache")),
    )?;
    fs::write(&stamp, pins).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(venv)
}

/// The installed version of a Debian package, if it is installed.
fn dpkg_version(pkg: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}\t${Version}", pkg])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (status, version) = text.split_once('\t')?;
    (status.ends_with(" installed") && !version.is_empty()).then(|| version.to_string())
}

/// `apt-get ARGS`, as root or through sudo, non-interactive, waiting for the dpkg lock.
fn apt_get(args: &[&str]) -> Command {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut c = if root {
        Command::new("apt-get")
    } else {
        let mut c = Command::new("sudo");
        c.arg("apt-get");
        c
    };
    c.env("DEBIAN_FRONTEND", "noninteractive")
        .args(["-o", "DPkg::Lock::Timeout=600", "-qq"])
        .args(args);
    c
}

/// `apt-get install` of the packages not installed yet (as root, or through sudo); an
/// `apt-get update` first only when the install cannot find them.
fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| dpkg_version(p).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("dist: apt-get install {}", missing.join(" "));
    let install = || {
        let mut c = apt_get(&["install", "-y", "--no-install-recommends"]);
        c.args(&missing);
        c
    };
    if run_ok(&mut install()).is_err() {
        run_ok(&mut apt_get(&["update"]))?;
        run_ok(&mut install()).map_err(|e| {
            format!(
                "{e}\nnext: these come from Debian bookworm (rustc-web 1.96 from \
                 bookworm-security); check the apt sources"
            )
        })?;
    }
    Ok(())
}

/// apt with its own state under `target/dist-tools/apt`, reading arm64 indexes of the Debian
/// archives the machine already uses: arm64 .debs are downloaded and unpacked, never installed
/// (no `dpkg --add-architecture`).
struct PrivateApt {
    dir: PathBuf,
    updated: std::cell::Cell<bool>,
}

impl PrivateApt {
    fn new(tools: &Path) -> Result<Self, String> {
        let dir = tools.join("apt");
        for d in ["lists/partial", "cache/archives/partial", "parts", "debs"] {
            fs::create_dir_all(dir.join(d))
                .map_err(|e| format!("{}: {e}", dir.join(d).display()))?;
        }
        let mut sources = String::new();
        for f in [
            "/etc/apt/sources.list",
            "/etc/apt/sources.list.d/debian.sources",
        ] {
            sources.push_str(&fs::read_to_string(f).unwrap_or_default());
        }
        if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
            for e in rd.flatten() {
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                // Only Debian's own archives: a third-party repository's arm64 index is no use.
                if text.contains("debian-archive-keyring") {
                    sources.push_str(&text);
                }
            }
        }
        let (main, security) = debian_archives(&sources);
        let codename = os_codename().unwrap_or_else(|| "bookworm".into());
        let opts = "[arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]";
        let list = format!(
            "deb {opts} {security} {codename}-security main\n\
             deb {opts} {main} {codename} main\n\
             deb {opts} {main} bullseye main\n"
        );
        let path = dir.join("sources.list");
        if fs::read_to_string(&path).ok().as_deref() != Some(list.as_str()) {
            fs::write(&path, &list).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(PrivateApt {
            dir,
            updated: std::cell::Cell::new(false),
        })
    }

    /// The options that point apt at the private state, for apt-get and apt-cache alike.
    fn options(&self) -> Vec<String> {
        let d = |k: &str, sub: &str| format!("{k}={}", self.dir.join(sub).display());
        [
            "APT::Architecture=arm64".to_string(),
            "APT::Architectures=arm64".to_string(),
            d("Dir::State::Lists", "lists"),
            d("Dir::Cache", "cache"),
            "Dir::State::Status=/dev/null".to_string(),
            d("Dir::Etc::SourceList", "sources.list"),
            d("Dir::Etc::SourceParts", "parts"),
            "APT::Sandbox::User=root".to_string(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect()
    }

    fn apt(&self, args: &[&str]) -> Command {
        let mut c = Command::new("apt-get");
        c.arg("-qq").args(self.options()).args(args);
        c
    }

    fn update(&self) -> Result<(), String> {
        if !self.updated.get() {
            eprintln!(
                "dist: apt-get update (private arm64 indexes in {})",
                self.dir.display()
            );
            run_ok(&mut self.apt(&["update"]))?;
            self.updated.set(true);
        }
        Ok(())
    }

    /// The arm64 .deb of `pkg` (at `version`, or the newest the archive serves), cached.
    fn download(&self, pkg: &str, version: Option<&str>) -> Result<PathBuf, String> {
        let debs = self.dir.join("debs");
        let find = || -> Option<PathBuf> {
            let prefix = format!("{pkg}_");
            let want = version.map(|v| format!("{pkg}_{}_arm64.deb", v.replace(':', "%3a")));
            fs::read_dir(&debs)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    let name = p
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned();
                    match &want {
                        Some(w) => name == *w,
                        None => name.starts_with(&prefix) && name.ends_with("_arm64.deb"),
                    }
                })
        };
        if let Some(p) = find() {
            return Ok(p);
        }
        self.update()?;
        let spec = match version {
            Some(v) => format!("{pkg}={v}"),
            None => pkg.to_string(),
        };
        // apt-get download writes into the current directory; use a scratch one and move the
        // finished file, so a cut download never sits in debs/ under its final name.
        let scratch = self.dir.join("download.tmp");
        remove_dir(&scratch)?;
        fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        eprintln!("dist: apt-get download {spec} (arm64)");
        run_ok(self.apt(&["download", &spec]).current_dir(&scratch)).map_err(|e| {
            format!(
                "{e}\nnext: the arm64 {spec} must be served by {}",
                self.dir.join("sources.list").display()
            )
        })?;
        for e in fs::read_dir(&scratch).map_err(|e| e.to_string())?.flatten() {
            let to = debs.join(e.file_name());
            fs::rename(e.path(), &to).map_err(|e| format!("{}: {e}", to.display()))?;
        }
        remove_dir(&scratch)?;
        find().ok_or_else(|| format!("apt-get download {spec} left no {pkg}_*_arm64.deb"))
    }

    /// The .deb unpacked (`dpkg -x`) into `dist-tools/<name>` without its maintainer scripts.
    fn unpacked(&self, pkg: &str, version: Option<&str>) -> Result<PathBuf, String> {
        let deb = self.download(pkg, version)?;
        let stem = deb
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let tools = self.dir.parent().ok_or("apt dir has no parent")?;
        let dest = tools.join(sanitize(&stem));
        if dest.join(".unpacked").is_file() {
            return Ok(dest);
        }
        let tmp = tools.join(format!(".{}.tmp", sanitize(&stem)));
        remove_dir(&tmp)?;
        run_ok(Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
        fs::write(tmp.join(".unpacked"), "").map_err(|e| e.to_string())?;
        remove_dir(&dest)?;
        fs::rename(&tmp, &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        Ok(dest)
    }

    /// Debian bullseye's arm64 libc6 (glibc 2.31, as on AGNOS), unpacked as a qemu `-L` root.
    fn unpacked_bullseye_libc(&self) -> Result<PathBuf, String> {
        let deb = self.download_bullseye_libc()?;
        let name = deb
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let version = name.split('_').nth(1).unwrap_or_default().to_string();
        let root = self.unpacked("libc6", Some(&version.replace("%3a", ":")))?;
        let ld = root.join("lib/ld-linux-aarch64.so.1");
        let libc = root.join("lib/aarch64-linux-gnu/libc-2.31.so");
        if !(ld.exists() && libc.exists()) {
            return Err(format!(
                "{} is not glibc 2.31 for arm64 ({} or {} missing)",
                root.display(),
                ld.display(),
                libc.display()
            ));
        }
        Ok(root)
    }

    fn download_bullseye_libc(&self) -> Result<PathBuf, String> {
        // Any cached libc6 2.31 will do; otherwise the newest bullseye one.
        let debs = self.dir.join("debs");
        if let Ok(rd) = fs::read_dir(&debs) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("libc6_2.31-") && n.ends_with("_arm64.deb") {
                    return Ok(e.path());
                }
            }
        }
        self.update()?;
        self.download("libc6", Some(&bullseye_libc_version(self)?))
    }
}

/// The version of libc6 that bullseye serves for arm64 (2.31-13+deb11uN).
fn bullseye_libc_version(apt: &PrivateApt) -> Result<String, String> {
    let mut c = Command::new("apt-cache");
    c.args(apt.options()).args(["madison", "libc6"]);
    let text = output(&mut c)?;
    glibc_231_version(&text).ok_or_else(|| {
        format!(
            "no libc6 2.31 for arm64 in the bullseye index (apt-cache madison said:\n{text})\n\
             next: the Debian archive must still serve bullseye"
        )
    })
}

/// From `apt-cache madison libc6` lines (`libc6 | 2.31-13+deb11u11 | URI bullseye/main arm64
/// Packages`), the newest 2.31 version.
pub fn glibc_231_version(madison: &str) -> Option<String> {
    madison
        .lines()
        .filter_map(|l| l.split('|').nth(1).map(str::trim))
        .filter(|v| v.starts_with("2.31-"))
        .max_by_key(|v| {
            // 2.31-13+deb11u11 -> (13, 11): Debian revision, then the stable update.
            let rev = v.trim_start_matches("2.31-");
            let (a, b) = rev.split_once("+deb11u").unwrap_or((rev, "0"));
            (a.parse::<u32>().unwrap_or(0), b.parse::<u32>().unwrap_or(0))
        })
        .map(str::to_string)
}

fn os_codename() -> Option<String> {
    let text = fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Copy the workspace at `from` to `to`, leaving out `target/` and `.git`.
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for e in fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let name = e.file_name();
        if from == util::root() && (name == "target" || name == ".git") {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        let ty = e.file_type().map_err(|e| e.to_string())?;
        if ty.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ty.is_file() {
            fs::copy(&src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}

fn remove_dir(d: &Path) -> Result<(), String> {
    match fs::remove_dir_all(d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", d.display())),
    }
}

pub fn sha256_file(p: &Path) -> Result<String, String> {
    let out = output(Command::new("sha256sum").arg(p))?;
    out.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum {} printed nothing", p.display()))
}

fn run_ok(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_glibc_version_is_found_among_needs_and_symbols() {
        let cases: &[(&str, Option<GlibcVersion>)] = &[
            ("", None),
            ("  0x0010:   Name: GLIBC_PRIVATE  Flags: none", None),
            (
                "  0x0010:   Name: GLIBC_2.17  Flags: none  Version: 3\n  0x0020:   Name: GLIBC_2.30  Flags: none  Version: 5",
                Some(GlibcVersion(2, 30, 0)),
            ),
            (
                "  002:   2 (GLIBC_2.2.5)   3 (GLIBC_2.3.4)",
                Some(GlibcVersion(2, 3, 4)),
            ),
            (
                "Name: GLIBC_2.9 Name: GLIBC_2.17",
                Some(GlibcVersion(2, 17, 0)),
            ),
            (
                "Name: GLIBC_2.34 Name: GLIBC_2.17",
                Some(GlibcVersion(2, 34, 0)),
            ),
            ("GLIBC_2 GLIBC_x.y GLIBC_2.", None),
            ("(GLIBC_2.31)", Some(GlibcVersion(2, 31, 0))),
        ];
        for (text, want) in cases {
            assert_eq!(max_glibc(text), *want, "{text:?}");
        }
    }

    #[test]
    fn the_ceiling_is_inclusive_and_patch_levels_count() {
        assert!(GlibcVersion(2, 31, 0) <= GLIBC_CEILING);
        assert!(GlibcVersion(2, 30, 0) <= GLIBC_CEILING);
        assert!(GlibcVersion(2, 31, 1) > GLIBC_CEILING);
        assert!(GlibcVersion(2, 32, 0) > GLIBC_CEILING);
        assert!(GlibcVersion(3, 0, 0) > GLIBC_CEILING);
        assert_eq!(GlibcVersion(2, 30, 0).to_string(), "GLIBC_2.30");
        assert_eq!(GlibcVersion(2, 3, 4).to_string(), "GLIBC_2.3.4");
    }

    #[test]
    fn the_sha2_instructions_are_found_in_a_disassembly() {
        let all = "  4f2a1c:\tsha256h\tq0, q1, v2.4s\n  4f2a20:\tsha256h2\tq1, q3, v2.4s\n\
                   4f2a24:\tsha256su0\tv4.4s, v5.4s\n  4f2a28:\tsha256su1\tv4.4s, v6.4s, v7.4s\n";
        assert!(missing_sha2_instructions(all).is_empty());
        let some = "  10:\tsha256h\tq0, q1, v2.4s\n  14:\tsha256h2\tq1, q3, v2.4s\n  18:\tadd\tx0, x0, #1\n";
        assert_eq!(missing_sha2_instructions(some), ["sha256su0", "sha256su1"]);
        assert_eq!(missing_sha2_instructions(""), SHA2_INSTRUCTIONS);
        // A symbol named like an instruction is not one.
        assert_eq!(
            missing_sha2_instructions("0000000000001000 <sha256h_wrapper>:\n").len(),
            4
        );
    }

    #[test]
    fn the_elf_machine_is_read_from_the_header() {
        let h = "ELF Header:\n  Class:                             ELF64\n  Machine:                           AArch64\n  Version:                           0x1\n";
        assert_eq!(elf_machine(h), Some("AArch64"));
        assert_eq!(
            elf_machine("  Machine:   Advanced Micro Devices X86-64\n"),
            Some("Advanced Micro Devices X86-64")
        );
        assert_eq!(elf_machine("not an ELF"), None);
    }

    #[test]
    fn debian_rustc_versions_give_major_and_minor() {
        let cases = [
            ("1.96.0+dfsg1-1~deb12u2", Some((1, 96))),
            ("1.85.0+dfsg3-1~deb12u3", Some((1, 85))),
            ("1:1.95.1-2", Some((1, 95))),
            ("garbage", None),
        ];
        for (v, want) in cases {
            assert_eq!(rustc_minor(v), want, "{v}");
        }
        assert!(rustc_minor("1.85.0+dfsg3-1~deb12u3").unwrap() < MIN_RUSTC);
        assert!(rustc_minor("1.96.0+dfsg1-1~deb12u2").unwrap() >= MIN_RUSTC);
    }

    #[test]
    fn the_machines_debian_archives_are_reused() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\nTypes: deb\nURIs: http://mirror.example/debian-security/\nSuites: bookworm-security\n";
        assert_eq!(
            debian_archives(deb822),
            (
                "http://mirror.example/debian".to_string(),
                "http://mirror.example/debian-security".to_string()
            )
        );
        let one_line = "deb [arch=amd64] https://m.example/debian bookworm main\n";
        assert_eq!(debian_archives(one_line).0, "https://m.example/debian");
        assert_eq!(
            debian_archives(""),
            (
                "http://deb.debian.org/debian".to_string(),
                "http://deb.debian.org/debian-security".to_string()
            )
        );
    }

    #[test]
    fn the_newest_bullseye_glibc_231_is_chosen() {
        let madison = "     libc6 | 2.36-9+deb12u10 | http://deb.debian.org/debian bookworm/main arm64 Packages\n\
                       \x20    libc6 | 2.31-13+deb11u9 | http://deb.debian.org/debian bullseye/main arm64 Packages\n\
                       \x20    libc6 | 2.31-13+deb11u11 | http://deb.debian.org/debian bullseye/main arm64 Packages\n";
        assert_eq!(
            glibc_231_version(madison).as_deref(),
            Some("2.31-13+deb11u11")
        );
        assert_eq!(glibc_231_version("libc6 | 2.36-9 | x"), None);
    }
}
