//! What the fake API servers of `tests/cluster.rs` and `tests/controller.rs` share: a hyper
//! body that is whole or a stream of watch-event lines, a JSON response, and the accept loop.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::body::{Body, Bytes, Frame};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, body: &Value) -> Response<FakeBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(FakeBody::Full(Some(Bytes::from(
            serde_json::to_vec(body).expect("JSON"),
        ))))
        .expect("response")
}

/// A whole body, or a stream of watch event lines that ends when the fake drops its sender.
pub enum FakeBody {
    Full(Option<Bytes>),
    Stream(mpsc::UnboundedReceiver<Bytes>),
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            FakeBody::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            FakeBody::Stream(lines) => lines
                .poll_recv(cx)
                .map(|line| line.map(|line| Ok(Frame::data(line)))),
        }
    }
}

/// Serves HTTP/1.1 on `listener` for ever, each request answered by `handle`.
pub fn serve<F, R>(listener: TcpListener, handle: F)
where
    F: Fn(Request<Incoming>) -> R + Clone + Send + Sync + 'static,
    R: Future<Output = Result<Response<FakeBody>, Infallible>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(handle);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
