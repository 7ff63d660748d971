//! What every example needs: a Redis to talk to and readable logs.

use redis_process::RedisServer;

/// `$REDIS_URL` if set; otherwise a private redis-server on a free port,
/// stopped when the returned guard is dropped.
pub fn redis_url() -> (String, Option<RedisServer>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (url, None);
    }
    match RedisServer::start() {
        Ok(server) => {
            println!("started a private redis-server at {}", server.url());
            (server.url(), Some(server))
        }
        Err(err) => {
            eprintln!("error: {err}\n(or point REDIS_URL at a Redis you run)");
            std::process::exit(2);
        }
    }
}

pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
