//! `cargo xtask dist --test`'s hashing story: the aarch64 device binary, under qemu, installs
//! and verifies the same published artifact once on a CPU that reports the ARMv8 SHA-2
//! instructions and once on one that does not, and `status -v` names the SHA-256 backend each
//! time (the instructions, then the portable code).
//!
//! qemu 7.2's aarch64 CPU models all report SHA-2 (there is no `sha2=off` property). Each model
//! is asked first; when none lacks it, the CPU "without" is `cortex-a53` with the `AT_HWCAP`
//! bit of SHA-2 cleared for the guest: a small `LD_PRELOAD` library (built with the dist venv's
//! zig for glibc 2.31) wraps `getauxval`, which is where both `sha2` (through `cpufeatures`)
//! and `std::arch::is_aarch64_feature_detected!` learn the CPU's features on Linux.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench_device::{device_command, entry, mkdirs, sidecar_digest, spawn_server};

const GENERATION: &str = "v25";
const ID: &str = "hashstory";
/// `HWCAP_SHA2` of the aarch64 Linux `AT_HWCAP` word.
const HWCAP_SHA2_BIT: u32 = 6;
/// What `status -v` prints for each backend (`chunker::hash_backend`).
const WITH: &str = "SHA-256 backend: ARMv8 SHA-2 instructions";
const WITHOUT: &str = "SHA-256 backend: portable";

/// A CPU for qemu: `QEMU_CPU`, and the guest's `LD_PRELOAD` when the HWCAP mask is used.
#[derive(Debug, Clone)]
pub struct Cpu {
    pub model: String,
    pub preload: Option<PathBuf>,
}

impl Cpu {
    fn describe(&self) -> String {
        match &self.preload {
            None => format!("-cpu {}", self.model),
            Some(_) => format!("-cpu {} with HWCAP_SHA2 cleared", self.model),
        }
    }
}

/// Run the story. `qemu` is the emulator, `glibc_root` its `-L` root, `zig` a command that
/// runs `zig cc`, `host` the directory of the host's `release-cli` and `test-http-server`.
pub fn run(
    qemu: &Path,
    glibc_root: &Path,
    bin: &Path,
    with_cpu: &str,
    zig: &mut dyn FnMut() -> Command,
    host: &Path,
    work: &Path,
) -> Result<(), String> {
    let _ = fs::remove_dir_all(work);
    mkdirs(work)?;
    let runner = |cpu: &Cpu, args: &[&str], device: &Path, url: &str| {
        let inner = device_command(bin, device, url, args);
        let mut c = Command::new(qemu);
        c.env("QEMU_LD_PREFIX", glibc_root)
            .env("QEMU_CPU", &cpu.model)
            .arg(bin)
            .args(inner.get_args());
        if let Some(p) = &cpu.preload {
            let mut v = OsString::from("LD_PRELOAD=");
            v.push(p);
            c.env("QEMU_SET_ENV", v);
        }
        c
    };

    // Publish one chunked artifact and serve it.
    let origin = work.join("origin");
    let model_dir = origin.join(format!("hf/models/{GENERATION}/{ID}"));
    mkdirs(&model_dir)?;
    mkdirs(&origin.join("hf/manifests"))?;
    mkdirs(&origin.join("gh"))?;
    let name = format!("{ID}_driving_tinygrad.pkl");
    let artifact = work.join(&name);
    let size: u64 = 6 << 20;
    crate::bench::write_pseudo_random(&artifact, size)?;
    ok(Command::new(host.join("release-cli"))
        .args(["chunk", "split"])
        .arg(&artifact)
        .arg("--out-dir")
        .arg(&model_dir)
        .args(["--chunk-size", &(2u64 << 20).to_string()]))?;
    let sha = sidecar_digest(&model_dir.join(format!("{name}.sha256")))?;
    fs::write(
        origin.join(format!("hf/manifests/model_names_{GENERATION}.json")),
        format!(
            "{{\n  \"models\": [\n{}\n  ]\n}}\n",
            entry(ID, size, &sha, 3)
        ),
    )
    .map_err(|e| e.to_string())?;
    let server_bin = host.join("test-http-server");
    let (_server, url) = spawn_server(
        Command::new(&server_bin)
            .arg("--dir")
            .arg(&origin)
            .args(["--addr", "127.0.0.1:0"]),
        &server_bin,
    )?;

    let with = Cpu {
        model: with_cpu.to_string(),
        preload: None,
    };
    let without = cpu_without(qemu, work, with_cpu, zig, &|cpu: &Cpu| {
        let device = work.join("probe");
        let _ = mkdirs(&device.join("builtin"));
        let out = runner(cpu, &["status", "-v"], &device, &url)
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stderr).into_owned())
    })?;

    for (cpu, expect) in [(&with, WITH), (&without, WITHOUT)] {
        let device = work.join(format!(
            "device-{}",
            if cpu.preload.is_some() {
                "masked"
            } else {
                cpu.model.as_str()
            }
        ));
        mkdirs(&device.join("builtin"))?;
        for args in [&["refresh"][..], &["download", ID], &["verify", ID]] {
            ok(&mut runner(cpu, args, &device, &url))?;
        }
        let status = ok(&mut runner(cpu, &["status", "-v"], &device, &url))?;
        if !status.contains(expect) {
            return Err(format!(
                "under qemu {} `status -v` did not say {expect:?}:\n{status}",
                cpu.describe()
            ));
        }
        let installed = device.join("models").join(&name);
        let got = crate::dist::sha256_file(&installed)?;
        if got != sha {
            return Err(format!(
                "under qemu {} the installed {} has sha256 {got}, not {sha}",
                cpu.describe(),
                installed.display()
            ));
        }
        eprintln!(
            "dist: under qemu {}: installed and verified {name} (sha256 {sha}); status -v: {expect}",
            cpu.describe()
        );
    }
    let _ = fs::remove_dir_all(work);
    Ok(())
}

/// A CPU qemu runs the binary on that reports no SHA-2: the first model `qemu -cpu help` lists
/// whose `status -v` says portable, else `with_cpu` with the HWCAP bit cleared.
fn cpu_without(
    qemu: &Path,
    work: &Path,
    with_cpu: &str,
    zig: &mut dyn FnMut() -> Command,
    status_of: &dyn Fn(&Cpu) -> Option<String>,
) -> Result<Cpu, String> {
    let listed = Command::new(qemu)
        .args(["-cpu", "help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for model in cpu_models(&listed) {
        let cpu = Cpu {
            model: model.to_string(),
            preload: None,
        };
        if status_of(&cpu).is_some_and(|s| s.contains(WITHOUT)) {
            return Ok(cpu);
        }
    }
    eprintln!(
        "dist: every CPU model of qemu-aarch64 reports SHA-2; clearing HWCAP_SHA2 for -cpu {with_cpu}"
    );
    let src = work.join("no-sha2.c");
    let lib = work.join("no-sha2.so");
    fs::write(&src, preload_source()).map_err(|e| format!("{}: {e}", src.display()))?;
    ok(zig()
        .args([
            "cc",
            "-target",
            "aarch64-linux-gnu.2.31",
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
        ])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl"))?;
    Ok(Cpu {
        model: with_cpu.to_string(),
        preload: Some(lib),
    })
}

/// The model names of `qemu-aarch64 -cpu help` (indented lines after the heading). Pure.
pub fn cpu_models(help: &str) -> Vec<&str> {
    help.lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// The `LD_PRELOAD` library that reports the CPU without SHA-2.
pub fn preload_source() -> String {
    format!(
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <sys/auxv.h>\n\
         /* The CPU as one without the ARMv8 SHA-2 instructions: HWCAP_SHA2 cleared. */\n\
         unsigned long getauxval(unsigned long type) {{\n\
         \x20 static unsigned long (*real)(unsigned long);\n\
         \x20 if (!real) real = (unsigned long (*)(unsigned long))dlsym(RTLD_NEXT, \"getauxval\");\n\
         \x20 unsigned long v = real(type);\n\
         \x20 return type == AT_HWCAP ? v & ~(1UL << {HWCAP_SHA2_BIT}) : v;\n}}\n"
    )
}

/// Run `cmd`; its stdout and stderr, or an error with both.
fn ok(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{cmd:?} failed ({}):\n{text}", out.status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_cpu_models_are_read_from_its_help() {
        let help = "Available CPUs:\n  a64fx\n  cortex-a35\n  cortex-a53\n  max\n";
        assert_eq!(
            cpu_models(help),
            ["a64fx", "cortex-a35", "cortex-a53", "max"]
        );
        assert!(cpu_models("").is_empty());
    }

    #[test]
    fn the_preload_clears_only_the_sha2_bit_of_hwcap() {
        let c = preload_source();
        assert!(c.contains("type == AT_HWCAP ? v & ~(1UL << 6) : v"), "{c}");
        assert!(c.contains("dlsym(RTLD_NEXT, \"getauxval\")"), "{c}");
    }
}
