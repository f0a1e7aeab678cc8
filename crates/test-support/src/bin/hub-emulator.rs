//! Run the Hub emulator by hand: prints `HF_ENDPOINT` and the write token, then serves until
//! killed, printing each request it answers to stderr. `hub-emulator [--uplink-rate BYTES_PER_SEC]
//! [--quiet] [BUCKET...]` creates the named buckets first and seeds `datasets/org/src` with
//! `builds/seed.bin`; `--uplink-rate` caps the request bodies of all connections together (one
//! release machine's uplink, see `HubEmulator::limit_uplink`); `--quiet` prints no requests.
use test_support::hub::{HubConfig, HubEmulator};

fn main() {
    let mut uplink = 0u64;
    let mut quiet = false;
    let mut buckets = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--uplink-rate" => {
                uplink = match args.next().and_then(|v| v.parse().ok()) {
                    Some(v) => v,
                    None => {
                        eprintln!("hub-emulator: --uplink-rate needs a number of bytes per second");
                        std::process::exit(2);
                    }
                }
            }
            "--quiet" => quiet = true,
            _ => buckets.push(a),
        }
    }
    let hub = HubEmulator::start(HubConfig::default()).expect("start the emulator");
    hub.limit_uplink(uplink);
    for b in &buckets {
        hub.create_bucket(b);
    }
    hub.seed_repo_file("datasets", "org/src", "builds/seed.bin", b"seeded bytes\n");
    println!("HF_ENDPOINT={}", hub.url());
    println!("HF_TOKEN={}", hub.token());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut seen = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        if quiet {
            continue;
        }
        let log = hub.requests();
        for r in &log[seen..] {
            eprintln!(
                "{:?} {} {} -> {} in={} out={} auth={}",
                r.listener,
                r.method,
                r.target,
                r.status,
                r.bytes_in,
                r.bytes_out,
                r.authorization.is_some()
            );
        }
        seen = log.len();
    }
}
