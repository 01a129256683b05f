//! The few W3C WebDriver commands the browser tests send to chromedriver, over HTTP/1.1 on
//! loopback with tokio: new session, navigate, find elements, read text and attributes, click,
//! type, run script, screenshot, end session.
//!
//! Written here rather than taken from fantoccini: fantoccini's `webdriver` crate brings icu
//! 1.5, whose derive macros turn on syn's `fold`/`visit` features; that changed syn for every
//! proc-macro in the tree (serde, sqlx, tracing, tokio's macros), so the browser tests rebuilt
//! the whole dependency tree once more (~4 min of a 30-min CI run on a 2-core machine). The
//! protocol is JSON over plain HTTP (<https://www.w3.org/TR/webdriver2/>): one request per
//! connection (`Connection: close`), the reply read to its end.

use base64::Engine as _;
use serde_json::{json, Value};
use std::fmt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The key that identifies an element reference in a WebDriver reply.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How to find an element.
pub enum Locator<'a> {
    /// A CSS selector.
    Css(&'a str),
}

/// Keys with no character of their own, typed through [`Element::send_keys`].
pub enum Key {
    /// Return.
    Enter,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Enter => f.write_str("\u{E007}"),
        }
    }
}

/// A failed command: the HTTP exchange, or WebDriver's own error (`no such element`, …).
#[derive(Debug)]
pub struct CmdError(pub String);

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a command returns.
pub type CmdResult<T> = Result<T, CmdError>;

/// One browser session.
#[derive(Clone)]
pub struct Client {
    /// `127.0.0.1:<port>` of chromedriver.
    authority: String,
    session: String,
}

/// An element of the current page.
pub struct Element {
    client: Client,
    id: String,
}

/// One HTTP/1.1 exchange: `(status, body)`.
async fn http(authority: &str, method: &str, path: &str, body: &[u8]) -> CmdResult<(u16, Vec<u8>)> {
    let err = |what: &str, e: std::io::Error| CmdError(format!("{method} {path}: {what}: {e}"));
    let mut stream = TcpStream::connect(authority)
        .await
        .map_err(|e| err("connect", e))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| err("write", e))?;
    stream.write_all(body).await.map_err(|e| err("write", e))?;
    // chromedriver answers `Connection: close` but keeps the socket open: the reply ends where
    // its framing says (`Content-Length`, or the last chunk), not at end of stream.
    let bad = |why: &str| CmdError(format!("{method} {path}: {why}"));
    let mut reply = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if let Some(done) = framed(&reply) {
            let (status, body) = done.map_err(bad)?;
            return Ok((status, body));
        }
        let n = stream.read(&mut buf).await.map_err(|e| err("read", e))?;
        if n == 0 {
            return Err(bad("connection closed before the reply's end"));
        }
        reply.extend_from_slice(&buf[..n]);
    }
}

/// The status and body of a complete HTTP reply in `reply`; `None` while more is to come.
fn framed(reply: &[u8]) -> Option<Result<(u16, Vec<u8>), &'static str>> {
    let split = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&reply[..split]).to_ascii_lowercase();
    let Some(status) = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()) else {
        return Some(Err("reply without a status"));
    };
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim() == name)
            .map(|(_, v)| v.trim().to_string())
    };
    let raw = &reply[split + 4..];
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return dechunk(raw).map(|body| Ok((status, body)));
    }
    let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) else {
        return Some(Err("reply without a Content-Length"));
    };
    (raw.len() >= len).then(|| Ok((status, raw[..len].to_vec())))
}

/// The body of a `Transfer-Encoding: chunked` reply; `None` until its last chunk is in.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Sends one command and returns the reply's `value`, or WebDriver's error as a [`CmdError`].
async fn command(
    authority: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> CmdResult<Value> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let (status, reply) = http(authority, method, path, body.as_bytes()).await?;
    let reply: Value = serde_json::from_slice(&reply)
        .map_err(|e| CmdError(format!("{method} {path}: reply is not JSON ({e})")))?;
    let value = reply.get("value").cloned().unwrap_or(Value::Null);
    if status >= 400 || value.get("error").is_some_and(|e| !e.is_null()) {
        return Err(CmdError(format!(
            "{method} {path}: {status} {} {}",
            value["error"].as_str().unwrap_or("?"),
            value["message"].as_str().unwrap_or("")
        )));
    }
    Ok(value)
}

impl Client {
    /// Opens a session on chromedriver at `127.0.0.1:<port>` with these capabilities.
    pub async fn connect(port: u16, capabilities: Value) -> CmdResult<Client> {
        let authority = format!("127.0.0.1:{port}");
        let body = json!({ "capabilities": { "alwaysMatch": capabilities } });
        let value = command(&authority, "POST", "/session", Some(body)).await?;
        let session = value["sessionId"]
            .as_str()
            .ok_or_else(|| CmdError(format!("new session without an id: {value}")))?
            .to_string();
        Ok(Client { authority, session })
    }

    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> CmdResult<Value> {
        let path = format!("/session/{}{path}", self.session);
        // Boxed: every command's future would otherwise sit inline in the test's own (large,
        // unoptimized) future, which overflowed the test thread's stack.
        Box::pin(command(&self.authority, method, &path, body)).await
    }

    fn element(&self, v: &Value) -> CmdResult<Element> {
        let id = v[ELEMENT_KEY]
            .as_str()
            .ok_or_else(|| CmdError(format!("not an element reference: {v}")))?;
        Ok(Element {
            client: self.clone(),
            id: id.to_string(),
        })
    }

    fn using(locator: Locator<'_>) -> Value {
        match locator {
            Locator::Css(css) => json!({ "using": "css selector", "value": css }),
        }
    }

    /// Loads `url` and waits for its load event.
    pub async fn goto(&self, url: &str) -> CmdResult<()> {
        self.cmd("POST", "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    /// The current page's URL.
    pub async fn current_url(&self) -> CmdResult<String> {
        let v = self.cmd("GET", "/url", None).await?;
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| CmdError(format!("URL is not a string: {v}")))
    }

    /// Reloads the page.
    pub async fn refresh(&self) -> CmdResult<()> {
        self.cmd("POST", "/refresh", Some(json!({})))
            .await
            .map(drop)
    }

    /// The page's HTML.
    pub async fn source(&self) -> CmdResult<String> {
        let v = self.cmd("GET", "/source", None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The first element `locator` matches.
    pub async fn find(&self, locator: Locator<'_>) -> CmdResult<Element> {
        let v = self
            .cmd("POST", "/element", Some(Self::using(locator)))
            .await?;
        self.element(&v)
    }

    /// Every element `locator` matches.
    pub async fn find_all(&self, locator: Locator<'_>) -> CmdResult<Vec<Element>> {
        let v = self
            .cmd("POST", "/elements", Some(Self::using(locator)))
            .await?;
        v.as_array()
            .ok_or_else(|| CmdError(format!("elements are not a list: {v}")))?
            .iter()
            .map(|e| self.element(e))
            .collect()
    }

    /// The focused element.
    pub async fn active_element(&self) -> CmdResult<Element> {
        let v = self.cmd("GET", "/element/active", None).await?;
        self.element(&v)
    }

    /// Runs `script` in the page and returns its result.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> CmdResult<Value> {
        let body = json!({ "script": script, "args": args });
        self.cmd("POST", "/execute/sync", Some(body)).await
    }

    /// Runs `script`, which ends by calling its last argument with the result.
    pub async fn execute_async(&self, script: &str, args: Vec<Value>) -> CmdResult<Value> {
        let body = json!({ "script": script, "args": args });
        self.cmd("POST", "/execute/async", Some(body)).await
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> CmdResult<Vec<u8>> {
        let v = self.cmd("GET", "/screenshot", None).await?;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .map_err(|e| CmdError(format!("screenshot is not base64: {e}")))
    }

    /// Ends the session (the browser closes).
    pub async fn close(&self) -> CmdResult<()> {
        self.cmd("DELETE", "", None).await.map(drop)
    }
}

impl Element {
    async fn cmd(&self, method: &str, what: &str, body: Option<Value>) -> CmdResult<Value> {
        let path = format!("/element/{}{what}", self.id);
        self.client.cmd(method, &path, body).await
    }

    /// Its rendered text.
    pub async fn text(&self) -> CmdResult<String> {
        let v = self.cmd("GET", "/text", None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// Its attribute `name`, if it has one.
    pub async fn attr(&self, name: &str) -> CmdResult<Option<String>> {
        let v = self.cmd("GET", &format!("/attribute/{name}"), None).await?;
        Ok(v.as_str().map(str::to_owned))
    }

    /// Clicks it.
    pub async fn click(&self) -> CmdResult<()> {
        self.cmd("POST", "/click", Some(json!({}))).await.map(drop)
    }

    /// Types `text` into it ([`Key`]s included through their `Display`).
    pub async fn send_keys(&self, text: &str) -> CmdResult<()> {
        self.cmd("POST", "/value", Some(json!({ "text": text })))
            .await
            .map(drop)
    }
}

#[test]
fn replies_end_where_their_framing_says() {
    let reply = b"HTTP/1.1 200 OK\r\nContent-Length:5\r\nConnection:close\r\n\r\nhello";
    assert_eq!(framed(&reply[..reply.len() - 1]), None);
    assert_eq!(framed(reply), Some(Ok((200, b"hello".to_vec()))));
    let chunked =
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
    assert_eq!(framed(chunked), Some(Ok((404, b"hi".to_vec()))));
    assert_eq!(
        framed(b"HTTP/1.1 200 OK\r\n\r\n"),
        Some(Err("reply without a Content-Length"))
    );
}

#[test]
fn chunked_bodies_are_joined() {
    assert_eq!(
        dechunk(b"4\r\nWiki\r\n5;x=1\r\npedia\r\n0\r\n\r\n").as_deref(),
        Some(&b"Wikipedia"[..])
    );
    assert_eq!(dechunk(b"4\r\nWi"), None);
}
