//! The document shell of every console page: `<head>` with the console's stylesheet and script,
//! and the bare page (login, errors) that needs no session.

use maud::{DOCTYPE, Markup, html};

use super::paths;

/// `<head>`: title, stylesheet and script (all from the console itself).
pub(super) fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · deprov" }
            link rel="stylesheet" href=(paths::STYLE);
            script src=(paths::SCRIPT) defer {}
        }
    }
}

/// A page without navigation (login, errors).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { main.narrow { (body) } }
        }
    }
}
