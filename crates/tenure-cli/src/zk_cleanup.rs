//! What `tenure demo` leaves on a ZooKeeper ensemble, deleted: the
//! election's persistent `/PREFIX/{NAME}` znode and what is under it, and
//! the lease of its last leader, which the demo stops without a release
//! (its session, and so the ephemeral lease, would outlive the demo by a
//! ttl), as the demo deletes its keys from a shared Redis.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use zookeeper_client as zk;

/// Delete the demo election `name`'s znodes under the URL's chroot;
/// complain in one line if that fails (nothing else depends on it).
pub async fn forget(url: &str, name: &str) {
    let prefix = tenure::DEFAULT_PREFIX;
    let (lease, dir) = (format!("/{prefix}/{name}"), format!("/{prefix}/{{{name}}}"));
    if let Err(err) = delete_tree(url, &lease, &dir).await {
        crate::complain!("tenure: could not delete the demo's znode {dir}: {err}");
    }
}

async fn delete_tree(url: &str, lease: &str, dir: &str) -> Result<(), String> {
    let rest = url.strip_prefix("zk://").ok_or("not a zk:// URL")?;
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, rest),
    };
    let mut connector = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_fail_eagerly();
    if let Some(userinfo) = user {
        let decoded = percent_decode_str(userinfo)
            .decode_utf8()
            .map_err(|_| "the user is not UTF-8")?;
        connector = connector.with_auth("digest", decoded.as_bytes());
    }
    let client = tokio::time::timeout(Duration::from_secs(5), connector.connect(hosts))
        .await
        .map_err(|_| "no session within 5s".to_string())?
        .map_err(|err| err.to_string())?;
    match client.delete(lease, None).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(err) => return Err(format!("{lease}: {err}")),
    }
    let children = match client.list_children(dir).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Ok(()),
        Err(err) => return Err(err.to_string()),
    };
    for child in children {
        let path = format!("{dir}/{child}");
        match client.delete(&path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(err) => return Err(format!("{path}: {err}")),
        }
    }
    match client.delete(dir, None).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(err) => Err(err.to_string()),
    }
}
