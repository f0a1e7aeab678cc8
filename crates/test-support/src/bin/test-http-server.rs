//! `test-http-server --dir D [--addr 127.0.0.1:0] [--rate-per-conn BYTES_PER_SEC] [--latency-ms N]
//! [--single-thread]
//! [--fault PATH_PREFIX*=FAULT]...`
//!
//! Serves `D` with the fault server's normal behaviour plus the per-connection bandwidth cap and
//! latency, for benchmarks; each `--fault` applies a fault (`trickle:MS`, `stall`,
//! `slow:BYTES_PER_SEC`, `status:CODE`, see `Fault::parse`) to every request under a path. With
//! `--stats-file F --count PREFIX...`, `F` holds one `PREFIX BYTES` line per prefix (body bytes
//! served under it), rewritten every 100 ms. Prints `http://ADDR` as its first stdout line, then
//! serves until killed. With `--single-thread`, the directory is served instead by one thread
//! that answers each connection's requests in order (`test_support::inorder_server`: the cap and
//! latency apply, faults and stats do not).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use test_support::http_server::{Fault, FaultServer, ServerConfig};

fn main() -> ExitCode {
    let mut dir: Option<PathBuf> = None;
    let mut config = ServerConfig::new(PathBuf::new());
    let mut faults: Vec<(String, Fault)> = Vec::new();
    let mut stats: Option<PathBuf> = None;
    let mut counted: Vec<String> = Vec::new();
    let mut single_thread = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let res: Result<(), String> = (|| {
            match flag.as_str() {
                "--dir" => dir = Some(PathBuf::from(value()?)),
                "--addr" => {
                    config.addr = value()?
                        .parse::<SocketAddr>()
                        .map_err(|e| format!("--addr: {e}"))?
                }
                "--rate-per-conn" => {
                    let v: u64 = value()?
                        .parse()
                        .map_err(|e| format!("--rate-per-conn: {e}"))?;
                    config.rate_per_conn = (v > 0).then_some(v);
                }
                "--latency-ms" => {
                    let v: u64 = value()?.parse().map_err(|e| format!("--latency-ms: {e}"))?;
                    config.latency = Duration::from_millis(v);
                }
                "--fault" => {
                    let v = value()?;
                    let (path, spec) = v
                        .split_once('=')
                        .ok_or_else(|| format!("--fault {v:?}: expected PATH=FAULT"))?;
                    faults.push((path.to_string(), Fault::parse(spec)?));
                }
                "--stats-file" => stats = Some(PathBuf::from(value()?)),
                "--count" => counted.push(value()?),
                "--single-thread" => single_thread = true,
                "-h" | "--help" => {
                    println!(
                        "usage: test-http-server --dir D [--addr 127.0.0.1:0] [--rate-per-conn BYTES_PER_SEC] [--latency-ms N] [--single-thread] [--fault PATH_PREFIX*=trickle:MS|stall|slow:BPS|status:CODE]..."
                    );
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
            Ok(())
        })();
        if let Err(e) = res {
            eprintln!("test-http-server: {e}");
            return ExitCode::from(2);
        }
    }
    let Some(dir) = dir else {
        eprintln!("test-http-server: --dir is required");
        return ExitCode::from(2);
    };
    config.root = dir;
    if single_thread {
        if !faults.is_empty() || stats.is_some() {
            eprintln!("test-http-server: --single-thread serves no --fault and no --stats-file");
            return ExitCode::from(2);
        }
        let listener = match std::net::TcpListener::bind(config.addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("test-http-server: cannot listen: {e}");
                return ExitCode::from(1);
            }
        };
        let addr = listener.local_addr().expect("a bound address");
        println!("http://{addr}");
        let _ = std::io::stdout().flush();
        let served = test_support::inorder_server::serve(
            listener,
            &config.root,
            config.rate_per_conn,
            config.latency,
        );
        eprintln!("test-http-server: {served:?}");
        return ExitCode::from(1);
    }
    let server = match FaultServer::with_config(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("test-http-server: cannot listen: {e}");
            return ExitCode::from(1);
        }
    };
    for (path, fault) in faults {
        server.add_fault(&path, fault, None);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", server.url());
    let _ = out.flush();
    drop(out);
    loop {
        match &stats {
            Some(file) => {
                let body: String = counted
                    .iter()
                    .map(|p| format!("{p} {}\n", server.body_bytes_under(p)))
                    .collect();
                let tmp = file.with_extension("tmp");
                if std::fs::write(&tmp, body).is_ok() {
                    let _ = std::fs::rename(&tmp, file);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None => std::thread::park(),
        }
    }
}
