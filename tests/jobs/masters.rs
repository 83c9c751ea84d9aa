//! Faults on the masters the Job tests inject: a master that locks the operator out while its keys run on.

const LOCKED_OUT_PASSWORD: &str = "locked-out";

/// Closes every client connection of a master and makes new ones need a password the operator does not have:
/// the master keeps running, and its keys expire on their own clock.
pub async fn lock_out(url: &str) {
    let mut conn = redis_connection(url).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(LOCKED_OUT_PASSWORD)
        .query_async(&mut conn)
        .await
        .expect("set a password");
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut conn)
        .await
        .expect("close the other connections");
}

pub async fn let_in(url: &str) {
    let mut conn =
        redis_connection(&url.replacen("redis://", &format!("redis://:{LOCKED_OUT_PASSWORD}@"), 1)).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("")
        .query_async(&mut conn)
        .await
        .expect("remove the password");
}

/// Gives `key` ten minutes on the master, wherever it still exists.
pub async fn keep_key(url: &str, key: &str) {
    let authed = url.replacen("redis://", &format!("redis://:{LOCKED_OUT_PASSWORD}@"), 1);
    let mut conn = match redis::Client::open(authed.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
    {
        Ok(conn) => conn,
        Err(_) => redis_connection(url).await,
    };
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(600_000)
        .query_async(&mut conn)
        .await
        .expect("PEXPIRE");
}

pub async fn redis_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the master")
}
