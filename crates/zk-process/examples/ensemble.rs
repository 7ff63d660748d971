//! Start a private 3-member ensemble, print its `zk://` URL, and keep it
//! until standard input closes (Ctrl-D), for trying tenure by hand:
//!
//! ```sh
//! cargo run -p zk-process --example ensemble
//! ```

use std::io::Read;
use std::time::Duration;

fn main() {
    let ensemble = match zk_process::ZkEnsemble::builder()
        .tick_time(Duration::from_millis(100))
        .start()
    {
        Ok(ensemble) => ensemble,
        Err(err) => {
            eprintln!("cannot start a ZooKeeper ensemble: {err}");
            std::process::exit(1);
        }
    };
    println!("{}", ensemble.url());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(ensemble);
}
