//! The API client the reconcilers write through: it refuses every write while this replica is not the active one,
//! checked by the gate ([`Leadership::is_leader`]) at the moment the request would leave. No write site checks
//! leadership by hand before its call, and a new one cannot forget to: the finalizer helper's patches, the Event
//! recorder's and every status, Job, pod and record write meet the same check, later than any hand-written one
//! could make it. Reads pass, so a standby keeps reading (the quorum reconciler checks masters on standbys too);
//! the Lease's own writes, which a standby must make to take over, go through the client underneath.

use std::sync::Arc;

use hyper::{Method, Request};
use kube::Client;
use kube::client::Body;
use tower::BoxError;

use super::gate::Leadership;

/// Why a write was not sent: this replica is not the active one. The reconcilers read it as
/// `Error::NotLeader` (`controller::error`): not an error of the object, and not a request of unknown outcome.
#[derive(Debug, thiserror::Error)]
#[error("not the active replica: the write was not sent")]
pub struct NotActive;

/// `client`, refusing every request but a read while `leadership` says this replica may not write.
pub fn writes_only_while_active(client: Client, leadership: Arc<Leadership>) -> Client {
    let default_namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: Request<Body>| {
        // Decided here, when the request is sent, not when its future is polled: what goes out is what the gate
        // allowed at that instant.
        let refused = is_write(request.method()) && !leadership.is_leader();
        let client = client.clone();
        async move {
            if refused {
                return Err(BoxError::from(NotActive));
            }
            client.send(request).await.map_err(BoxError::from)
        }
    });
    Client::new(service, default_namespace)
}

/// Whether `err` is this client's refusal of a write (the request never left).
pub fn refused_as_standby(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Service(source) if source.is::<NotActive>())
}

/// Anything but a read changes something on the API server (a TokenReview's POST creates nothing, but only the
/// active replica answers reports, and it asks before anything else).
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// A client whose "API server" counts the requests that reached it and answers each with 200.
    fn counting_client(reached: Arc<AtomicUsize>) -> Client {
        let service = tower::service_fn(move |_request: Request<Body>| {
            reached.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(hyper::Response::new(Body::empty())) }
        });
        Client::new(service, "default")
    }

    fn request(method: Method) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri("/apis/redlock.io/v1beta1/namespaces/a/distributedlocks/l/status")
            .body(Body::empty())
            .unwrap_or_else(|err| panic!("a request: {err}"))
    }

    #[tokio::test]
    async fn a_standby_reads_but_its_writes_never_leave() {
        let reached = Arc::new(AtomicUsize::new(0));
        let leadership = Leadership::new();
        let client = writes_only_while_active(counting_client(reached.clone()), leadership.clone());

        assert!(client.send(request(Method::GET)).await.is_ok(), "a read passes");
        assert_eq!(reached.load(Ordering::SeqCst), 1);
        for write in [Method::PUT, Method::PATCH, Method::POST, Method::DELETE] {
            let refused = client.send(request(write.clone())).await;
            match refused {
                Err(err) => assert!(refused_as_standby(&err), "{write}: {err}"),
                Ok(_) => panic!("{write} was sent by a standby"),
            }
        }
        assert_eq!(
            reached.load(Ordering::SeqCst),
            1,
            "no write reached the API server"
        );

        leadership.extend_until(Instant::now() + Duration::from_secs(60));
        assert!(
            client.send(request(Method::PATCH)).await.is_ok(),
            "the active replica writes"
        );
        assert_eq!(reached.load(Ordering::SeqCst), 2);

        leadership.step_down();
        let after = client.send(request(Method::PUT)).await;
        assert!(
            after.is_err_and(|err| refused_as_standby(&err)),
            "refused again once it stepped down"
        );
        assert_eq!(reached.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn errors_of_the_api_server_are_not_taken_for_a_refusal() {
        let failing = tower::service_fn(|_request: Request<Body>| async {
            Err::<hyper::Response<Body>, _>(BoxError::from(std::io::Error::other("connection reset")))
        });
        let client = writes_only_while_active(Client::new(failing, "default"), Leadership::always());
        let failed = client.send(request(Method::PATCH)).await;
        assert!(failed.is_err_and(|err| !refused_as_standby(&err)));
    }
}
