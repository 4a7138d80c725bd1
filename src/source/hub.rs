//! The Hugging Face Hub over HTTP: one metadata call that pins a revision to its commit and lists
//! the files, whole small files (an index), and byte ranges of the others, each checked as a
//! Range reply must be (206, `Content-Range` matching what was asked, the body all there, the
//! `ETag` the same from one request of a file to the next). Rate limits and server errors are
//! waited out a bounded number of times; everything else is an error that names the repository
//! and says what to do.

use super::{Environment, RepoRef};
use crate::text::escape;

/// Bytes of the little-endian header length that starts a safetensors file.
const LENGTH_PREFIX: u64 = 8;

/// The largest header the format allows: 100,000,000 bytes.
const MAX_HEADER_LEN: u64 = 100_000_000;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The Hub when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Attempts of one request when the server is rate limiting or failing (429, 5xx).
const ATTEMPTS: u32 = 4;

/// The longest wait for a rate limit to pass before giving up.
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// Characters escaped in a revision (all but unreserved ones, `/` included, as `refs%2Fpr%2F1`).
const REVISION: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Characters escaped in a path segment (`/` separates segments and is kept).
const SEGMENT: &AsciiSet = REVISION;

/// Why the Hub could not be read; the message names the repository and says what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RemoteError(pub String);

/// A client of one Hub endpoint, with the user's token; counts the requests it makes.
#[derive(Debug)]
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
    requests: AtomicU64,
}

/// A repository at one commit, as the metadata call lists it.
#[derive(Clone, Debug)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<RepoFile>,
}

/// A file of a repository.
#[derive(Clone, Debug)]
pub struct RepoFile {
    pub path: String,
    pub size: Option<u64>,
    /// The blob's id: the sha256 of an LFS file's bytes, the git blob id of others.
    pub blob: Option<String>,
}

/// The bytes of a range, with the file's size and `ETag` as the reply gave them.
#[derive(Clone, Debug)]
pub struct RangeReply {
    pub bytes: Vec<u8>,
    pub file_len: u64,
    pub etag: Option<String>,
}

/// A safetensors file's header as [`Hub::header`] reads it: the length prefix and the header,
/// then whatever bytes after it the first request brought too.
#[derive(Debug)]
pub struct Header {
    bytes: Vec<u8>,
    /// Where the data section starts: the end of the header.
    data_start: usize,
    /// The file's size.
    pub file_len: u64,
}

impl Header {
    /// The header `bytes` (the length prefix and the header), with nothing after them.
    pub fn alone(bytes: Vec<u8>, file_len: u64) -> Header {
        Header {
            data_start: bytes.len(),
            bytes,
            file_len,
        }
    }

    /// The length prefix and the header.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.data_start]
    }

    /// The bytes right after the header that came with it.
    pub fn after(&self) -> &[u8] {
        &self.bytes[self.data_start..]
    }
}

/// Whether `HF_HUB_OFFLINE` (or the older `TRANSFORMERS_OFFLINE`) forbids the network.
pub fn offline(env: &dyn Environment) -> bool {
    ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
        .iter()
        .any(|name| {
            env.var(name).is_some_and(|value| {
                matches!(
                    value.to_string_lossy().trim().to_ascii_uppercase().as_str(),
                    "1" | "ON" | "YES" | "TRUE"
                )
            })
        })
}

/// The user's token: `HF_TOKEN`, the older `HUGGING_FACE_HUB_TOKEN`, else the token file
/// (`HF_TOKEN_PATH`, else `$HF_HOME/token`, else `~/.cache/huggingface/token`).
pub fn token(env: &dyn Environment) -> Option<String> {
    let clean = |text: String| {
        let text = text.replace(['\r', '\n'], "");
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    };
    for name in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"] {
        if let Some(value) = env.var(name) {
            return clean(value.to_string_lossy().into_owned());
        }
    }
    let file = if let Some(path) = env.var("HF_TOKEN_PATH") {
        std::path::PathBuf::from(path)
    } else if let Some(home) = env.var("HF_HOME") {
        std::path::PathBuf::from(home).join("token")
    } else if let Some(cache) = env.var("XDG_CACHE_HOME") {
        std::path::PathBuf::from(cache).join("huggingface/token")
    } else {
        std::path::PathBuf::from(env.var("HOME")?).join(".cache/huggingface/token")
    };
    let file = super::expand_home(&file, env);
    clean(std::fs::read_to_string(file).ok()?)
}

impl Hub {
    /// A client of `HF_ENDPOINT` (the Hub by default) with the user's token; an error when
    /// `HF_HUB_OFFLINE` is set. Proxies come from `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and
    /// `NO_PROXY`.
    pub fn from_env(env: &dyn Environment) -> Result<Hub, RemoteError> {
        let endpoint = env.var("HF_ENDPOINT").map_or_else(
            || DEFAULT_ENDPOINT.to_owned(),
            |value| value.to_string_lossy().trim_end_matches('/').to_owned(),
        );
        if !endpoint.starts_with("https://") && !endpoint.starts_with("http://") {
            return Err(RemoteError(format!(
                "HF_ENDPOINT is `{}`, not an http:// or https:// address",
                escape(&endpoint)
            )));
        }
        Ok(Hub::new(endpoint, token(env)))
    }

    pub fn new(endpoint: String, token: Option<String>) -> Hub {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .accept_encoding("identity")
            .user_agent(concat!("stui/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            // As many as the shards' headers are requested on at once, on the Hub and on the host
            // it redirects to, so each connection (and its TLS handshake) is reused.
            .max_idle_connections_per_host(64)
            .max_idle_connections(128)
            // Each connection keeps its buffers while idle: the input buffer sized for the longest
            // response head ureq accepts (bodies are read through it in pieces), the output buffer
            // for a GET's head, rather than 128 KiB each.
            .input_buffer_size(64 * 1024)
            .output_buffer_size(16 * 1024)
            .build();
        Hub {
            endpoint,
            token,
            agent: config.into(),
            requests: AtomicU64::new(0),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Requests sent so far, retries included (not counting the redirects followed).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The commit the revision names now and the repository's files at that commit.
    pub fn repo_info(&self, repo: &RepoRef) -> Result<RepoInfo, RemoteError> {
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.endpoint,
            repo.id,
            utf8_percent_encode(repo.revision(), REVISION)
        );
        let what = format!("`{repo}`");
        let mut response = self.send(&url, None, &what, repo)?;
        let body = read_body(&mut response, 64 << 20, &what)?;
        let json: serde_json::Value = serde_json::from_slice(&body).map_err(|error| {
            RemoteError(format!(
                "{}: the Hub's description of {what} is not JSON ({error}); is HF_ENDPOINT a Hub?",
                self.endpoint
            ))
        })?;
        let commit = json
            .get("sha")
            .and_then(serde_json::Value::as_str)
            .filter(|sha| super::hf_cache::is_commit(sha))
            .ok_or_else(|| {
                RemoteError(format!(
                    "{}: the Hub's description of {what} names no commit",
                    self.endpoint
                ))
            })?;
        let files = json
            .get("siblings")
            .and_then(serde_json::Value::as_array)
            .map(|siblings| {
                siblings
                    .iter()
                    .filter_map(|sibling| {
                        let path = sibling.get("rfilename")?.as_str()?.to_owned();
                        let lfs = sibling.get("lfs");
                        let size = lfs
                            .and_then(|l| l.get("size"))
                            .or_else(|| sibling.get("size"))
                            .and_then(serde_json::Value::as_u64);
                        let blob = lfs
                            .and_then(|l| l.get("sha256"))
                            .or_else(|| sibling.get("blobId"))
                            .and_then(serde_json::Value::as_str)
                            .map(str::to_owned);
                        Some(RepoFile { path, size, blob })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(RepoInfo {
            commit: commit.to_owned(),
            files,
        })
    }

    /// The address of a file at a commit.
    pub fn file_url(&self, repo: &RepoRef, commit: &str, path: &str) -> String {
        let path: Vec<String> = path
            .split('/')
            .map(|segment| utf8_percent_encode(segment, SEGMENT).to_string())
            .collect();
        format!(
            "{}/{}/resolve/{commit}/{}",
            self.endpoint,
            repo.id,
            path.join("/")
        )
    }

    /// A whole file of at most `limit` bytes (an index).
    pub fn file(
        &self,
        repo: &RepoRef,
        commit: &str,
        path: &str,
        limit: u64,
    ) -> Result<Vec<u8>, RemoteError> {
        let url = self.file_url(repo, commit, path);
        let what = format!("`{}` of `{repo}`", escape(path));
        let mut response = self.send(&url, None, &what, repo)?;
        if response.status() != 200 {
            return Err(RemoteError(format!(
                "{what}: the server answered {} to a plain request ({url})",
                response.status()
            )));
        }
        read_body(&mut response, limit, &what)
    }

    /// `len` bytes of a file from `start` (fewer at the end of the file), in one Range request.
    pub fn range(
        &self,
        repo: &RepoRef,
        commit: &str,
        path: &str,
        start: u64,
        len: u64,
    ) -> Result<RangeReply, RemoteError> {
        let url = self.file_url(repo, commit, path);
        let what = format!("`{}` of `{repo}`", escape(path));
        let end = start.saturating_add(len.max(1)) - 1;
        let mut response = self.send(&url, Some((start, end)), &what, repo)?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let etag = header("x-linked-etag")
            .or_else(|| header("etag"))
            .map(|e| normalize_etag(&e));
        if status == 416 {
            // Asked from past the end: only an empty file's first range is.
            let total = header("content-range").and_then(|r| parse_unsatisfied(&r));
            if start == 0
                && let Some(total) = total
            {
                return Ok(RangeReply {
                    bytes: Vec::new(),
                    file_len: total,
                    etag,
                });
            }
            return Err(RemoteError(format!(
                "{what}: the server refused the range bytes={start}-{end} (416, Content-Range {})",
                header("content-range")
                    .as_deref()
                    .map_or("absent".into(), escape)
            )));
        }
        if status == 200 {
            return Err(RemoteError(format!(
                "{what}: the server sent the whole file (200) for a Range request (bytes={start}-{end}): \
                 it does not serve byte ranges, and stui reads headers only; use a Hub or mirror that \
                 does ({url})"
            )));
        }
        if status != 206 {
            return Err(RemoteError(format!(
                "{what}: unexpected answer {status} to a Range request ({url})"
            )));
        }
        let content_range = header("content-range").ok_or_else(|| {
            RemoteError(format!(
                "{what}: a 206 reply without Content-Range for bytes={start}-{end}"
            ))
        })?;
        let (first, last, total) = parse_content_range(&content_range).ok_or_else(|| {
            RemoteError(format!(
                "{what}: a 206 reply with a Content-Range of `{}`, not `bytes FIRST-LAST/SIZE`",
                escape(&content_range)
            ))
        })?;
        if first != start || last > end || last >= total {
            return Err(RemoteError(format!(
                "{what}: asked for bytes={start}-{end}, the server sent {} (Content-Range)",
                escape(&content_range)
            )));
        }
        let expected = last - first + 1;
        let bytes = read_body(&mut response, expected, &what)?;
        if bytes.len() as u64 != expected {
            return Err(RemoteError(format!(
                "{what}: the reply ended after {} of the {expected} bytes its Content-Range promised \
                 (bytes={start}-{end}); try again",
                bytes.len()
            )));
        }
        Ok(RangeReply {
            bytes,
            file_len: total,
            etag,
        })
    }

    /// A safetensors file's length prefix and header (all of it, up to the format's limit):
    /// one Range request of `likely` bytes, and a second only when the header is longer than
    /// what the first *received*, for the rest of it and a quarter of its length more (up to 1
    /// MiB). Returns the header and the bytes past it that came with it (the start of the data
    /// section, where a writer that sorts its tensors by dtype puts the small `I64` ones).
    pub fn header(
        &self,
        repo: &RepoRef,
        commit: &str,
        path: &str,
        likely: u64,
    ) -> Result<Header, RemoteError> {
        let first = self.range(repo, commit, path, 0, likely.max(LENGTH_PREFIX))?;
        let mut bytes = first.bytes;
        let received = bytes.len() as u64;
        let Some(prefix) = bytes.first_chunk::<8>() else {
            return Ok(Header::alone(bytes, first.file_len));
        };
        let header_len = u64::from_le_bytes(*prefix);
        if header_len > MAX_HEADER_LEN {
            return Ok(Header::alone(bytes, first.file_len));
        }
        let needed = (LENGTH_PREFIX + header_len).min(first.file_len);
        if needed > received {
            let more = (header_len / 4).clamp(4096, 1 << 20);
            let end = needed.saturating_add(more).min(first.file_len);
            let rest = self.range(repo, commit, path, received, end - received)?;
            if rest.etag != first.etag || rest.file_len != first.file_len {
                return Err(RemoteError(format!(
                    "`{}` of `{repo}` changed between two requests (ETag {} then {}, size {} then {}): try again",
                    escape(path),
                    first.etag.as_deref().map_or("absent".into(), escape),
                    rest.etag.as_deref().map_or("absent".into(), escape),
                    first.file_len,
                    rest.file_len
                )));
            }
            bytes.extend_from_slice(&rest.bytes);
        }
        // Within what was received, which a `usize` holds.
        Ok(Header {
            data_start: usize::try_from(needed).map_or(bytes.len(), |end| end.min(bytes.len())),
            bytes,
            file_len: first.file_len,
        })
    }

    /// Sends a GET (with a range, when given), waiting out rate limits and retrying server
    /// errors a bounded number of times; any other error status becomes a [`RemoteError`].
    fn send(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        what: &str,
        repo: &RepoRef,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let mut backoff = Duration::from_millis(250);
        for attempt in 1..=ATTEMPTS {
            let mut request = self.agent.get(url);
            if let Some((start, end)) = range {
                request = request.header("Range", format!("bytes={start}-{end}"));
            }
            if let Some(token) = &self.token {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let response = request
                .call()
                .map_err(|error| self.transport_error(&error, what))?;
            let status = response.status().as_u16();
            let last = attempt == ATTEMPTS;
            match status {
                429 => {
                    let wait = rate_limit_wait(&response);
                    if last || wait > LONGEST_WAIT {
                        return Err(RemoteError(format!(
                            "{what}: the Hub is rate limiting these requests (429; the limit resets \
                             in {} s): try again later{}",
                            wait.as_secs(),
                            if self.token.is_some() {
                                ""
                            } else {
                                ", or set HF_TOKEN for a higher limit"
                            }
                        )));
                    }
                    std::thread::sleep(wait);
                }
                408 | 500 | 502 | 503 | 504 if !last => {
                    std::thread::sleep(backoff);
                    backoff *= 2;
                }
                _ if status < 400 => return Ok(response),
                _ => return Err(self.status_error(&response, what, repo)),
            }
        }
        unreachable!("the last attempt returns")
    }

    fn transport_error(&self, error: &ureq::Error, what: &str) -> RemoteError {
        let hint = match error {
            ureq::Error::Timeout(_) => " (the server stopped answering; try again)",
            _ => {
                " (check the network, HF_ENDPOINT and the proxy variables; HF_HUB_OFFLINE=1 reads \
                 the local cache only)"
            }
        };
        RemoteError(format!(
            "{what}: cannot reach {}: {error}{hint}",
            self.endpoint
        ))
    }

    /// The message for an error status, from the Hub's `X-Error-Code` where it gives one.
    fn status_error(
        &self,
        response: &ureq::http::Response<ureq::Body>,
        what: &str,
        repo: &RepoRef,
    ) -> RemoteError {
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
        };
        let code = header("x-error-code");
        let page = format!("{}/{}", self.endpoint, repo.id);
        let token_hint = if self.token.is_some() {
            "the token in HF_TOKEN (or the token file) has no access to it"
        } else {
            "no token was sent: set HF_TOKEN (or run `hf auth login`)"
        };
        let message = match (status, code) {
            (401 | 403, "GatedRepo") => format!(
                "`{}` is a gated model: accept its licence on {page} and set HF_TOKEN to a token \
                 of the account that did{}",
                repo.id,
                if self.token.is_some() {
                    " (the token sent has no access yet)"
                } else {
                    " (no token was sent)"
                }
            ),
            (401, _) | (404, "RepoNotFound") => format!(
                "`{}` was not found on {}: check the name; if it is private or gated, {token_hint}",
                repo.id, self.endpoint
            ),
            (403, _) => format!(
                "{what}: access refused (403); {token_hint}, or it lacks the permission to read {page}"
            ),
            (404, "RevisionNotFound") => format!(
                "`{}` has no revision `{}`: check the branch, tag or commit on {page}",
                repo.id,
                escape(repo.revision())
            ),
            (404, _) => format!("{what} does not exist (404): check the path on {page}"),
            _ => format!(
                "{what}: the server answered {status}{}; try again later",
                if code.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", escape(code))
                }
            ),
        };
        RemoteError(message)
    }
}

/// Reads a reply's body, at most `limit` bytes; a cut connection is an error.
fn read_body(
    response: &mut ureq::http::Response<ureq::Body>,
    limit: u64,
    what: &str,
) -> Result<Vec<u8>, RemoteError> {
    let mut bytes = Vec::new();
    let reader = response
        .body_mut()
        .with_config()
        .limit(limit.saturating_add(1))
        .reader();
    match reader.take(limit.saturating_add(1)).read_to_end(&mut bytes) {
        Ok(_) if bytes.len() as u64 > limit => Err(RemoteError(format!(
            "{what}: the reply is longer than the {limit} bytes expected"
        ))),
        Ok(_) => Ok(bytes),
        Err(error) => Err(RemoteError(format!(
            "{what}: the connection was cut after {} bytes ({error}); try again",
            bytes.len()
        ))),
    }
}

/// `W/"abc"` and `"abc"` as `abc`.
fn normalize_etag(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_owned()
}

/// `bytes FIRST-LAST/SIZE` (a known size only).
fn parse_content_range(value: &str) -> Option<(u64, u64, u64)> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let (first, last, total) = (
        first.trim().parse().ok()?,
        last.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (first <= last).then_some((first, last, total))
}

/// `bytes */SIZE` of a 416 reply.
fn parse_unsatisfied(value: &str) -> Option<u64> {
    value.trim().strip_prefix("bytes */")?.trim().parse().ok()
}

/// How long a 429 reply asks to wait: the `t=` of its `RateLimit` header (`"resolvers";r=0;t=12`),
/// else `Retry-After`, else a second.
fn rate_limit_wait(response: &ureq::http::Response<ureq::Body>) -> Duration {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let from_rate_limit = header("ratelimit").and_then(|value| {
        value
            .split(';')
            .find_map(|part| part.trim().strip_prefix("t=")?.trim().parse::<u64>().ok())
    });
    let seconds = from_rate_limit
        .or_else(|| header("retry-after")?.trim().parse().ok())
        .unwrap_or(1);
    Duration::from_secs(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_content_ranges() {
        assert_eq!(parse_content_range("bytes 0-99/1000"), Some((0, 99, 1000)));
        assert_eq!(parse_content_range("bytes 0-7/*"), None);
        assert_eq!(parse_content_range("bytes 9-3/10"), None);
        assert_eq!(parse_unsatisfied("bytes */0"), Some(0));
    }

    #[test]
    fn escapes_revisions_and_paths() {
        let hub = Hub::new("http://h".into(), None);
        let repo = RepoRef::parse("org/name").unwrap();
        assert_eq!(
            hub.file_url(&repo, "c", "a b/c#.safetensors"),
            "http://h/org/name/resolve/c/a%20b/c%23.safetensors"
        );
        assert_eq!(
            utf8_percent_encode("refs/pr/1", REVISION).to_string(),
            "refs%2Fpr%2F1"
        );
    }
}
