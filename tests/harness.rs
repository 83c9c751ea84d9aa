//! The test harnesses themselves: a fault the safety checker relies on must really happen.

use std::time::Duration;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis_server::{Options, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(2)));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

async fn run_id(conn: &mut MultiplexedConnection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .expect("info");
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .expect("run_id")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_is_empty_and_stop_pauses() {
    let mut server = RedisServer::start().expect("master");
    let mut conn = connect(&server.url()).await.expect("connect");
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async::<()>(&mut conn)
        .await
        .expect("set");
    let before = run_id(&mut conn).await;
    server.restart().expect("restart");
    let mut conn = connect(&server.url()).await.expect("reconnect on the same port");
    let value: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("get");
    assert_eq!(value, None, "a restarted master is empty");
    assert_ne!(run_id(&mut conn).await, before);

    server.stop();
    let paused = tokio::time::timeout(Duration::from_millis(300), ping(&mut conn)).await;
    assert!(paused.is_err(), "a stopped master answers nothing");
    server.cont();
    assert_eq!(ping(&mut conn).await.expect("answers again"), "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_clock_expires_keys_early() {
    let server = RedisServer::start_with(Options {
        clock_rate: Some(2.0),
        ..Options::default()
    })
    .expect("master with a fast clock");
    let mut conn = connect(&server.url()).await.expect("connect");
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("PX")
        .arg(2_000)
        .query_async::<()>(&mut conn)
        .await
        .expect("set");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let present: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("get");
    assert!(present.is_some());
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let gone: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("get");
    assert_eq!(
        gone, None,
        "a 2 s key is gone after 1.5 s of real time on a 2x clock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_happen_one_direction_at_a_time() {
    let server = RedisServer::start().expect("master");
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let mut conn = connect(&proxy.url()).await.expect("connect through the proxy");
    assert_eq!(ping(&mut conn).await.expect("ping"), "PONG");

    // Latency, per direction, adds up across directions but not across requests.
    proxy.set_latency(Direction::ClientToServer, Duration::from_millis(100));
    let started = Instant::now();
    ping(&mut conn).await.expect("ping");
    assert!(started.elapsed() >= Duration::from_millis(100));
    proxy.set_latency(Direction::Both, Duration::ZERO);

    // Held requests: nothing reaches the master until released, then it all does, in order.
    proxy.hold(Direction::ClientToServer, true);
    let mut held = conn.clone();
    let set = tokio::spawn(async move {
        redis::cmd("SET")
            .arg("held")
            .arg("1")
            .query_async::<()>(&mut held)
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut direct = connect(&server.url()).await.expect("direct");
    let seen: Option<String> = redis::cmd("GET")
        .arg("held")
        .query_async(&mut direct)
        .await
        .expect("get");
    assert_eq!(seen, None, "the held SET has not reached the master");
    proxy.hold(Direction::ClientToServer, false);
    set.await.expect("task").expect("set after release");
    let seen: Option<String> = redis::cmd("GET")
        .arg("held")
        .query_async(&mut direct)
        .await
        .expect("get");
    assert_eq!(seen.as_deref(), Some("1"));

    // Held replies: the command runs, the client hears nothing until released.
    proxy.hold(Direction::ServerToClient, true);
    let mut held = conn.clone();
    let set = tokio::spawn(async move {
        redis::cmd("SET")
            .arg("reply-held")
            .arg("1")
            .query_async::<()>(&mut held)
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen: Option<String> = redis::cmd("GET")
        .arg("reply-held")
        .query_async(&mut direct)
        .await
        .expect("get");
    assert_eq!(seen.as_deref(), Some("1"), "the command ran");
    assert!(!set.is_finished(), "but its reply is held");
    proxy.hold(Direction::ServerToClient, false);
    set.await.expect("task").expect("reply after release");

    // Cut: the connection breaks; refuse: new ones are turned away.
    proxy.cut_all();
    assert!(ping(&mut conn).await.is_err(), "a cut connection fails");
    proxy.refuse(true);
    let refused = match connect(&proxy.url()).await {
        Ok(mut conn) => ping(&mut conn).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a refusing proxy lets no request through");
    proxy.refuse(false);
    let mut conn = connect(&proxy.url()).await.expect("accepted again");
    assert_eq!(ping(&mut conn).await.expect("ping"), "PONG");
}
