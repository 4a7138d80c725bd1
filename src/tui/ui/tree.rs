//! The layer tree pane.

use super::block;
use crate::tui::app::{App, Focus};
use ratatui::Frame;
use ratatui::layout::Rect;
use tui_tree_widget::Tree;

pub fn render(frame: &mut Frame, area: Rect, app: &mut App) {
    app.refresh_items();
    app.page = usize::from(area.height.saturating_sub(2)).max(1);
    let title = if app.search.is_empty() {
        "tree".to_owned()
    } else {
        format!("tree · /{}", crate::text::escape(&app.search))
    };
    let focused = app.focus == Focus::Tree && app.popup.is_none();
    let theme = app.theme;
    let Ok(tree) = Tree::new(&app.items) else {
        return;
    };
    let tree = tree
        .block(block(&title, focused, app))
        .highlight_style(theme.selected)
        .highlight_symbol("")
        .node_closed_symbol("▸ ")
        .node_open_symbol("▾ ")
        .node_no_children_symbol("  ");
    frame.render_stateful_widget(tree, area, &mut app.tree_state);
}
