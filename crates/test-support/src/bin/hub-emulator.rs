//! Run the Hub emulator by hand: prints `HF_ENDPOINT` and the write token, then serves until
//! killed, printing each request it answers to stderr. `hub-emulator [BUCKET...]` creates the
//! named buckets first and seeds `datasets/org/src` with `builds/seed.bin`.
use test_support::hub::{HubConfig, HubEmulator};

fn main() {
    let hub = HubEmulator::start(HubConfig::default()).expect("start the emulator");
    for b in std::env::args().skip(1) {
        hub.create_bucket(&b);
    }
    hub.seed_repo_file("datasets", "org/src", "builds/seed.bin", b"seeded bytes\n");
    println!("HF_ENDPOINT={}", hub.url());
    println!("HF_TOKEN={}", hub.token());
    let mut seen = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
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
