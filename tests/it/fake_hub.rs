//! A fake Hugging Face Hub on loopback for the remote tests: the metadata call, `resolve` (a file
//! kept in git answered directly, an LFS file redirected to a second host name, `localhost`
//! against `127.0.0.1`, as the Hub redirects to its CDN), byte ranges there, and every failure
//! the tests ask for. One connection a request (`Connection: close`), a thread each; it stops
//! after a bounded number of requests or when dropped.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The most requests one fake Hub answers.
const MAX_REQUESTS: usize = 20_000;

/// What the fake Hub does wrong, to the files it serves from its CDN host (or, for the
/// statuses, to `resolve` of the model's files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `resolve` answers this status, with this `X-Error-Code` (empty: none).
    Status(u16, &'static str),
    /// The first `resolve` answers 429 with `RateLimit: ...;t=1`, then all is well.
    RateLimitedOnce,
    /// `resolve` answers 500 the first time, then all is well.
    ServerErrorOnce,
    /// A Range request gets the whole file, 200.
    IgnoresRange,
    /// The `ETag` changes from one request of a file to the next.
    ChangingEtag,
    /// The body is shorter than `Content-Range` says (and `Content-Length` agrees with it).
    ShortBody,
    /// The connection is closed halfway through the body.
    CutConnection,
    /// Every Range request for a file's data (not from its start) is answered after this long.
    SlowData(Duration),
}

#[derive(Debug)]
struct Repo {
    commit: String,
    files: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, Default)]
struct State {
    repos: BTreeMap<String, Repo>,
    fault: Option<Fault>,
    /// Each request: `HOST METHOD PATH RANGE AUTH`.
    log: Vec<String>,
    etag_turn: usize,
}

pub struct FakeHub {
    port: u16,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl FakeHub {
    pub fn start() -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Relaxed)
                        || served.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS
                    {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = state.clone();
                    std::thread::spawn(move || serve(stream, port, &state));
                }
            });
        }
        FakeHub { port, state, stop }
    }

    /// `HF_ENDPOINT` for this Hub.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn add_repo(&self, id: &str, commit: &str, files: &[(&str, Vec<u8>)]) {
        self.state.lock().unwrap().repos.insert(
            id.to_owned(),
            Repo {
                commit: commit.to_owned(),
                files: files
                    .iter()
                    .map(|(path, bytes)| ((*path).to_owned(), bytes.clone()))
                    .collect(),
            },
        );
    }

    pub fn set_fault(&self, fault: Option<Fault>) {
        self.state.lock().unwrap().fault = fault;
    }

    /// The requests so far, and forgets them.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().log)
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn is_lfs(path: &str) -> bool {
    path.ends_with(".safetensors")
}

fn sha256(bytes: &[u8]) -> String {
    stui::hash::hex(Sha256::digest(bytes).as_slice())
}

fn blob_id(path: &str, bytes: &[u8]) -> String {
    // A git blob id is 40 hex digits; the fake needs only a stable one.
    if is_lfs(path) {
        sha256(bytes)
    } else {
        sha256(bytes)[..40].to_owned()
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Bytes of the body actually sent before the connection is closed.
    cut_at: Option<usize>,
}

impl Reply {
    fn new(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            cut_at: None,
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Reply {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    fn body(mut self, body: Vec<u8>) -> Reply {
        self.body = body;
        self
    }
}

fn serve(stream: TcpStream, port: u16, state: &Mutex<State>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let host = headers.get("host").cloned().unwrap_or_default();
    let range = headers.get("range").cloned();
    let reply = {
        let mut state = state.lock().unwrap();
        state.log.push(format!(
            "{host} {method} {target} {} {}",
            range.as_deref().unwrap_or("-"),
            if headers.contains_key("authorization") {
                "auth"
            } else {
                "-"
            }
        ));
        let slow = match state.fault {
            Some(Fault::SlowData(delay))
                if target.starts_with("/cdn/")
                    && range.as_deref().is_some_and(|r| !r.starts_with("bytes=0-")) =>
            {
                Some(delay)
            }
            _ => None,
        };
        let reply = answer(&mut state, port, &host, target, range.as_deref());
        drop(state);
        if let Some(delay) = slow {
            std::thread::sleep(delay);
        }
        reply
    };
    let mut stream = stream;
    let reason = match reply.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (name, value) in &reply.headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    let _ = write!(
        head,
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        reply.body.len()
    );
    let sent = reply.cut_at.unwrap_or(reply.body.len());
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&reply.body[..sent]);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn answer(state: &mut State, port: u16, host: &str, target: &str, range: Option<&str>) -> Reply {
    let path = target.split('?').next().unwrap_or("");
    let decode = |text: &str| text.replace("%2F", "/");
    if let Some(rest) = path.strip_prefix("/api/models/") {
        return model_info(state, rest);
    }
    if let Some(blob) = path.strip_prefix("/cdn/") {
        let Some(bytes) = state
            .repos
            .values()
            .flat_map(|r| r.files.values())
            .find(|bytes| sha256(bytes) == blob)
            .cloned()
        else {
            return Reply::new(404);
        };
        return serve_bytes(state, &bytes, blob, range);
    }
    // /{org}/{name}/resolve/{revision}/{path}
    let segments: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if segments.len() < 5 || segments[2] != "resolve" {
        return Reply::new(404);
    }
    let id = format!("{}/{}", segments[0], segments[1]);
    let file = segments[4].replace("%20", " ");
    match state.fault.clone() {
        Some(Fault::Status(status, code)) if is_lfs(&file) => {
            let mut reply = Reply::new(status);
            if !code.is_empty() {
                reply = reply.header("X-Error-Code", code);
            }
            return reply;
        }
        Some(Fault::RateLimitedOnce) => {
            state.fault = None;
            return Reply::new(429)
                .header("RateLimit", "\"resolvers\";r=0;t=1")
                .header(
                    "RateLimit-Policy",
                    "\"fixed window\";\"resolvers\";q=3000;w=300",
                );
        }
        Some(Fault::ServerErrorOnce) => {
            state.fault = None;
            return Reply::new(500);
        }
        _ => {}
    }
    let Some(repo) = state.repos.get(&id) else {
        return Reply::new(401).header("X-Error-Code", "RepoNotFound");
    };
    if decode(segments[3]) != repo.commit {
        return Reply::new(404).header("X-Error-Code", "RevisionNotFound");
    }
    let Some(bytes) = repo.files.get(&file).cloned() else {
        return Reply::new(404).header("X-Error-Code", "EntryNotFound");
    };
    let commit = repo.commit.clone();
    if is_lfs(&file) {
        // The Hub's host redirects to its CDN, a host of another name.
        let other = if host.starts_with("localhost") {
            "127.0.0.1"
        } else {
            "localhost"
        };
        return Reply::new(302)
            .header(
                "Location",
                format!("http://{other}:{port}/cdn/{}", sha256(&bytes)),
            )
            .header("X-Repo-Commit", commit)
            .header("X-Linked-Etag", format!("\"{}\"", sha256(&bytes)))
            .header("X-Linked-Size", bytes.len().to_string());
    }
    Reply::new(200)
        .header("ETag", format!("\"{}\"", blob_id(&file, &bytes)))
        .header("X-Repo-Commit", commit)
        .body(bytes)
}

fn serve_bytes(state: &mut State, bytes: &[u8], blob: &str, range: Option<&str>) -> Reply {
    let etag = if state.fault == Some(Fault::ChangingEtag) {
        state.etag_turn += 1;
        format!("\"{blob}-{}\"", state.etag_turn)
    } else {
        format!("\"{blob}\"")
    };
    let Some((first, last)) = range.and_then(parse_range) else {
        return Reply::new(200).header("ETag", etag).body(bytes.to_vec());
    };
    if state.fault == Some(Fault::IgnoresRange) {
        return Reply::new(200).header("ETag", etag).body(bytes.to_vec());
    }
    let total = bytes.len() as u64;
    if first >= total {
        return Reply::new(416).header("Content-Range", format!("bytes */{total}"));
    }
    let last = last.min(total - 1);
    let body = bytes[usize::try_from(first).unwrap()..=usize::try_from(last).unwrap()].to_vec();
    let mut reply = Reply::new(206)
        .header("ETag", etag)
        .header("Content-Range", format!("bytes {first}-{last}/{total}"));
    match state.fault {
        Some(Fault::ShortBody) => {
            let half = body.len() / 2;
            reply.body = body[..half].to_vec();
        }
        Some(Fault::CutConnection) => {
            reply.cut_at = Some(body.len() / 2);
            reply.body = body;
        }
        _ => reply.body = body,
    }
    reply
}

fn parse_range(value: &str) -> Option<(u64, u64)> {
    let (first, last) = value.strip_prefix("bytes=")?.split_once('-')?;
    Some((
        first.parse().ok()?,
        if last.is_empty() {
            u64::MAX
        } else {
            last.parse().ok()?
        },
    ))
}

/// `GET /api/models/{id}[/revision/{rev}]`: the commit and the files, with their blob ids.
fn model_info(state: &State, rest: &str) -> Reply {
    let decode = |text: &str| text.replace("%2F", "/");
    let segments: Vec<&str> = rest.splitn(4, '/').collect();
    let id = format!("{}/{}", segments[0], segments.get(1).unwrap_or(&""));
    let Some(repo) = state.repos.get(&id) else {
        return Reply::new(401).header("X-Error-Code", "RepoNotFound");
    };
    let revision = segments.get(3).map_or("main".into(), |r| decode(r));
    if revision != "main" && revision != repo.commit {
        return Reply::new(404).header("X-Error-Code", "RevisionNotFound");
    }
    let siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|(path, bytes)| {
            let mut sibling = serde_json::json!({
                "rfilename": path, "size": bytes.len(), "blobId": blob_id(path, bytes),
            });
            if is_lfs(path) {
                sibling["lfs"] = serde_json::json!({
                    "sha256": sha256(bytes), "size": bytes.len(), "pointerSize": 134,
                });
            }
            sibling
        })
        .collect();
    let body =
        serde_json::json!({"id": id, "sha": repo.commit, "gated": false, "siblings": siblings});
    Reply::new(200)
        .header("Content-Type", "application/json")
        .body(body.to_string().into_bytes())
}
