//! The one table of key bindings: it drives the keys, the footer hints and the help screen.

use super::action::Action;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Which bindings apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    Tree,
    Findings,
    Search,
    Popup,
    Quantize,
    Map,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Ctrl(char),
    Code(KeyCode),
}

impl Key {
    pub fn label(self) -> String {
        match self {
            Key::Char(' ') => "Space".into(),
            Key::Char(c) => c.to_string(),
            Key::Ctrl(c) => format!("Ctrl-{c}"),
            Key::Code(KeyCode::Up) => "↑".into(),
            Key::Code(KeyCode::Down) => "↓".into(),
            Key::Code(KeyCode::Left) => "←".into(),
            Key::Code(KeyCode::Right) => "→".into(),
            Key::Code(KeyCode::PageUp) => "PgUp".into(),
            Key::Code(KeyCode::PageDown) => "PgDn".into(),
            Key::Code(KeyCode::Home) => "Home".into(),
            Key::Code(KeyCode::End) => "End".into(),
            Key::Code(KeyCode::Enter) => "Enter".into(),
            Key::Code(KeyCode::Esc) => "Esc".into(),
            Key::Code(KeyCode::Tab) => "Tab".into(),
            Key::Code(KeyCode::Backspace) => "Bksp".into(),
            Key::Code(code) => format!("{code:?}"),
        }
    }

    fn matches(self, event: &KeyEvent) -> bool {
        let ctrl = event.modifiers.contains(KeyModifiers::CONTROL);
        match (self, event.code) {
            (Key::Char(c), KeyCode::Char(pressed)) => !ctrl && c == pressed,
            (Key::Ctrl(c), KeyCode::Char(pressed)) => ctrl && c == pressed.to_ascii_lowercase(),
            (Key::Code(code), pressed) => code == pressed,
            _ => false,
        }
    }
}

/// One binding: in `context`, any of `keys` does `action`. `footer` bindings are hinted at the
/// bottom of the screen.
#[derive(Debug)]
pub struct Binding {
    pub context: Context,
    pub keys: &'static [Key],
    pub action: Action,
    pub label: &'static str,
    pub footer: bool,
}

const fn bind(
    context: Context,
    keys: &'static [Key],
    action: Action,
    label: &'static str,
    footer: bool,
) -> Binding {
    Binding {
        context,
        keys,
        action,
        label,
        footer,
    }
}

use Context::{Findings, Map, Popup, Quantize, Search, Tree};
use KeyCode::{Backspace, Down, End, Enter, Esc, Home, Left, PageDown, PageUp, Right, Tab, Up};

pub static BINDINGS: &[Binding] = &[
    bind(
        Tree,
        &[Key::Code(Up), Key::Char('k')],
        Action::Up,
        "up",
        false,
    ),
    bind(
        Tree,
        &[Key::Code(Down), Key::Char('j')],
        Action::Down,
        "down",
        false,
    ),
    bind(
        Tree,
        &[Key::Code(Right), Key::Char('l')],
        Action::Expand,
        "open / into",
        false,
    ),
    bind(
        Tree,
        &[Key::Code(Left), Key::Char('h')],
        Action::Collapse,
        "close / out",
        false,
    ),
    bind(
        Tree,
        &[Key::Code(Enter), Key::Char(' ')],
        Action::Toggle,
        "open or close",
        false,
    ),
    bind(Tree, &[Key::Code(PageUp)], Action::PageUp, "page up", false),
    bind(
        Tree,
        &[Key::Code(PageDown)],
        Action::PageDown,
        "page down",
        false,
    ),
    bind(
        Tree,
        &[Key::Ctrl('u')],
        Action::HalfPageUp,
        "half page up",
        false,
    ),
    bind(
        Tree,
        &[Key::Ctrl('d')],
        Action::HalfPageDown,
        "half page down",
        false,
    ),
    bind(
        Tree,
        &[Key::Code(Home), Key::Char('g')],
        Action::First,
        "first",
        false,
    ),
    bind(
        Tree,
        &[Key::Code(End), Key::Char('G')],
        Action::Last,
        "last",
        false,
    ),
    bind(
        Tree,
        &[Key::Char('e')],
        Action::ExpandAll,
        "open all",
        false,
    ),
    bind(
        Tree,
        &[Key::Char('c')],
        Action::CollapseAll,
        "close all",
        false,
    ),
    bind(
        Tree,
        &[Key::Char('n')],
        Action::NextProblem,
        "next problem",
        true,
    ),
    bind(
        Tree,
        &[Key::Char('N')],
        Action::PreviousProblem,
        "previous problem",
        false,
    ),
    bind(Tree, &[Key::Char('/')], Action::StartSearch, "search", true),
    bind(
        Tree,
        &[Key::Char('L')],
        Action::ToggleLogHistogram,
        "log histogram",
        false,
    ),
    bind(
        Tree,
        &[Key::Char('p')],
        Action::TogglePause,
        "pause scan",
        false,
    ),
    bind(Tree, &[Key::Code(Tab)], Action::FocusNext, "findings", true),
    // Not hinted in the footer, which is full at 80 columns; the help lists it.
    bind(
        Tree,
        &[Key::Char('M')],
        Action::ToggleMap,
        "layer map",
        false,
    ),
    bind(
        Tree,
        &[Key::Char('R')],
        Action::ToggleRaw,
        "stored / logical",
        false,
    ),
    bind(Map, &[Key::Char('M')], Action::ToggleMap, "tree", true),
    bind(
        Map,
        &[Key::Code(Up), Key::Char('k')],
        Action::Up,
        "up",
        false,
    ),
    bind(
        Map,
        &[Key::Code(Down), Key::Char('j')],
        Action::Down,
        "down",
        false,
    ),
    bind(
        Map,
        &[Key::Code(Left), Key::Char('h')],
        Action::Left,
        "left",
        false,
    ),
    bind(
        Map,
        &[Key::Code(Right), Key::Char('l')],
        Action::Right,
        "right",
        false,
    ),
    bind(Map, &[Key::Code(PageUp)], Action::PageUp, "page up", false),
    bind(
        Map,
        &[Key::Code(PageDown)],
        Action::PageDown,
        "page down",
        false,
    ),
    bind(Map, &[Key::Code(Tab)], Action::MapMeasure, "measure", true),
    bind(
        Map,
        &[Key::Code(Enter)],
        Action::MapJump,
        "go to tensor",
        true,
    ),
    bind(
        Map,
        &[Key::Char('n')],
        Action::NextProblem,
        "next outlier",
        true,
    ),
    bind(
        Map,
        &[Key::Char('N')],
        Action::PreviousProblem,
        "previous outlier",
        false,
    ),
    bind(Map, &[Key::Char('e')], Action::MapExperts, "experts", true),
    bind(
        Map,
        &[Key::Char('/')],
        Action::StartSearch,
        "filter rows",
        true,
    ),
    bind(
        Findings,
        &[Key::Code(Up), Key::Char('k')],
        Action::Up,
        "up",
        false,
    ),
    bind(
        Findings,
        &[Key::Code(Down), Key::Char('j')],
        Action::Down,
        "down",
        false,
    ),
    bind(
        Findings,
        &[Key::Code(PageUp)],
        Action::PageUp,
        "page up",
        false,
    ),
    bind(
        Findings,
        &[Key::Code(PageDown)],
        Action::PageDown,
        "page down",
        false,
    ),
    bind(
        Findings,
        &[Key::Code(Home), Key::Char('g')],
        Action::First,
        "first",
        false,
    ),
    bind(
        Findings,
        &[Key::Code(End), Key::Char('G')],
        Action::Last,
        "last",
        false,
    ),
    bind(
        Findings,
        &[Key::Code(Enter)],
        Action::JumpToFinding,
        "go to tensor",
        true,
    ),
    bind(
        Findings,
        &[Key::Char('s')],
        Action::CycleSeverity,
        "severity filter",
        true,
    ),
    bind(Findings, &[Key::Code(Tab)], Action::FocusNext, "tree", true),
    bind(
        Search,
        &[Key::Code(Enter)],
        Action::SearchAccept,
        "keep filter",
        true,
    ),
    bind(
        Search,
        &[Key::Code(Esc)],
        Action::SearchCancel,
        "clear",
        true,
    ),
    bind(
        Search,
        &[Key::Code(Backspace)],
        Action::SearchDelete,
        "delete",
        false,
    ),
    bind(
        Popup,
        &[
            Key::Code(Esc),
            Key::Char('q'),
            Key::Char('?'),
            Key::Char('m'),
        ],
        Action::ClosePopup,
        "close",
        true,
    ),
    bind(Tree, &[Key::Char('Q')], Action::Quantize, "quantize", true),
    bind(
        Quantize,
        &[Key::Char('g')],
        Action::QuantizeGranularity,
        "channel/tensor",
        true,
    ),
    bind(
        Quantize,
        &[Key::Char('s')],
        Action::QuantizeSkipNonFinite,
        "skip NaN/Inf",
        true,
    ),
    bind(
        Quantize,
        &[Key::Char('S')],
        Action::QuantizeScheme,
        "scheme",
        true,
    ),
    bind(
        Quantize,
        &[Key::Char('k')],
        Action::QuantizeKeepBelow,
        "keep below SNR",
        true,
    ),
    bind(
        Quantize,
        &[Key::Char('w')],
        Action::QuantizeWholeModel,
        "whole model",
        true,
    ),
    bind(
        Quantize,
        &[Key::Code(Enter)],
        Action::QuantizeConfirm,
        "save",
        true,
    ),
    bind(
        Quantize,
        &[Key::Char('o')],
        Action::OpenResult,
        "open result",
        true,
    ),
    bind(
        Quantize,
        &[Key::Code(Esc)],
        Action::QuantizeCancel,
        "cancel / close",
        true,
    ),
];

/// Bindings that apply everywhere but in search, checked after the context's own.
pub static GLOBAL: &[Binding] = &[
    bind(
        Tree,
        &[Key::Char('m')],
        Action::ShowMetadata,
        "metadata",
        true,
    ),
    bind(Tree, &[Key::Char('?')], Action::ShowHelp, "help", true),
    bind(Tree, &[Key::Char('q')], Action::Quit, "quit", true),
    bind(
        Tree,
        &[Key::Code(Esc)],
        Action::Escape,
        "stop download / quit",
        false,
    ),
];

/// The action a key press asks for in `context`.
pub fn lookup(context: Context, event: &KeyEvent) -> Option<Action> {
    if event.modifiers.contains(KeyModifiers::CONTROL) && event.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    let own = BINDINGS.iter().filter(|b| b.context == context);
    let global = GLOBAL
        .iter()
        .filter(|_| matches!(context, Context::Tree | Context::Findings | Context::Map));
    if let Some(binding) = own
        .chain(global)
        .find(|b| b.keys.iter().any(|k| k.matches(event)))
    {
        return Some(binding.action);
    }
    match (context, event.code) {
        (Context::Search, KeyCode::Char(c)) if !event.modifiers.contains(KeyModifiers::CONTROL) => {
            Some(Action::SearchType(c))
        }
        _ => None,
    }
}

/// The footer hints for `context`: `(keys, label, action)`.
pub fn hints(context: Context) -> Vec<(String, &'static str, Action)> {
    let global = GLOBAL
        .iter()
        .filter(|_| matches!(context, Context::Tree | Context::Findings | Context::Map));
    BINDINGS
        .iter()
        .filter(|b| b.context == context)
        .chain(global)
        .filter(|b| b.footer)
        .map(|b| (b.keys[0].label(), b.label, b.action))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, modifiers)
    }

    #[test]
    fn keys_map_to_actions_by_context() {
        assert_eq!(
            lookup(Context::Tree, &key(KeyCode::Char('j'), KeyModifiers::NONE)),
            Some(Action::Down)
        );
        assert_eq!(
            lookup(
                Context::Tree,
                &key(KeyCode::Char('d'), KeyModifiers::CONTROL)
            ),
            Some(Action::HalfPageDown)
        );
        assert_eq!(
            lookup(
                Context::Search,
                &key(KeyCode::Char('j'), KeyModifiers::NONE)
            ),
            Some(Action::SearchType('j'))
        );
        assert_eq!(
            lookup(
                Context::Search,
                &key(KeyCode::Char('c'), KeyModifiers::CONTROL)
            ),
            Some(Action::Quit)
        );
        assert_eq!(
            lookup(
                Context::Findings,
                &key(KeyCode::Char('q'), KeyModifiers::NONE)
            ),
            Some(Action::Quit)
        );
        assert_eq!(
            lookup(Context::Popup, &key(KeyCode::Char('q'), KeyModifiers::NONE)),
            Some(Action::ClosePopup)
        );
        assert_eq!(
            lookup(Context::Tree, &key(KeyCode::F(5), KeyModifiers::NONE)),
            None
        );
    }

    #[test]
    fn no_key_is_bound_twice_in_one_context() {
        for context in [
            Context::Tree,
            Context::Findings,
            Context::Search,
            Context::Popup,
            Context::Map,
        ] {
            let mut seen = Vec::new();
            let global = GLOBAL
                .iter()
                .filter(|_| matches!(context, Context::Tree | Context::Findings | Context::Map));
            for binding in BINDINGS
                .iter()
                .filter(|b| b.context == context)
                .chain(global)
            {
                for key in binding.keys {
                    assert!(!seen.contains(key), "{key:?} twice in {context:?}");
                    seen.push(*key);
                }
            }
        }
    }
}
