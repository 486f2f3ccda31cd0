use hoox_edge::mutex::{self, Clock, Config};
use std::time::Instant;
fn main() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (m, owner) = mutex::start(
        Config {
            path: dir.path().join("p.redb"),
            ..Config::default()
        },
        Clock::system(),
    );
    rt.block_on(async {
        let mut v = vec![];
        for _ in 0..3000 {
            let t = Instant::now();
            m.ping().await.unwrap();
            v.push(t.elapsed().as_nanos() as u64);
            let t2 = Instant::now();
            while t2.elapsed().as_micros() < 60 {}
        }
        v.sort();
        println!(
            "ping after 60us busy: p50 {} ns p90 {} ns",
            v[v.len() / 2],
            v[v.len() * 9 / 10]
        );
        let mut v = vec![];
        for _ in 0..3000 {
            let t = Instant::now();
            m.ping().await.unwrap();
            v.push(t.elapsed().as_nanos() as u64);
            std::thread::sleep(std::time::Duration::from_micros(60));
        }
        v.sort();
        println!(
            "ping after 60us sleep: p50 {} ns p90 {} ns",
            v[v.len() / 2],
            v[v.len() * 9 / 10]
        );
    });
    owner.stop();
}
