//! The live-refresh selector: 5 s on the overview and off on lists by default, the `dh_refresh`
//! cookie's choice everywhere once made, and nonsense in the cookie ignored.

use crate::support::{get, Fixture};
use dockhand::ui::Access;

fn selected(html: &str) -> Option<String> {
    let at = html.find("data-refresh-select")?;
    let rest = &html[at..];
    let end = rest.find("</select>")?;
    let sel = &rest[..end];
    let i = sel.find(" selected")?;
    let v = sel[..i].rfind("value=\"")?;
    let tail = &sel[v + 7..];
    Some(tail[..tail.find('"')?].to_string())
}

#[tokio::test]
async fn refresh_defaults_and_the_cookie_choice() {
    let f = Fixture::new().await;
    let app = f.app(f.config(Access::ReadOnly));
    let page = |path: &'static str, cookie: &'static str| {
        let app = app.clone();
        async move {
            let headers: Vec<(&str, &str)> = if cookie.is_empty() {
                vec![]
            } else {
                vec![("cookie", cookie)]
            };
            get(&app, path, &headers).await.text()
        }
    };
    assert_eq!(selected(&page("/", "").await).as_deref(), Some("5"));
    assert_eq!(selected(&page("/actions", "").await).as_deref(), Some("0"));
    assert_eq!(
        selected(&page("/actions", "dh_refresh=15").await).as_deref(),
        Some("15")
    );
    assert_eq!(
        selected(&page("/", "dh_refresh=0").await).as_deref(),
        Some("0")
    );
    assert_eq!(
        selected(&page("/", "dh_refresh=lots").await).as_deref(),
        Some("5")
    );
    let html = page("/", "").await;
    assert!(html.contains(r#"data-refresh-default="5""#), "{html}");
}
