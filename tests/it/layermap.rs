//! The layer map: its layout on the demo, a mixture-of-experts model and a 61-layer model with planted faults,
//! in the explorer (app state and test backend screens) and from `stui stats --map`.

use crate::support;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::{Color, Modifier};
use std::path::Path;
use std::sync::{Arc, mpsc};
use stui::finding::Code;
use stui::format::Model;
use stui::jobs::{Scan, ScanOptions};
use stui::layermap::{Measure, Problem, State};
use stui::tui::action::Action;
use stui::tui::app::App;
use stui::tui::{Theme, ui};

fn open(path: &Path, colored: bool) -> App {
    App::new(Arc::new(Model::open(path).unwrap()), Theme::new(colored))
}

/// The planted model, written in `dir`.
fn planted(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("planted.safetensors");
    support::planted_layers().write(&path).unwrap();
    path
}

/// Runs the real scan over every tensor and hands the app each event.
fn scan(app: &mut App) {
    let (sender, receiver) = mpsc::sync_channel(64);
    let options = ScanOptions {
        threads: Some(1),
        ..ScanOptions::default()
    };
    let _scan = Scan::start(
        Arc::clone(&app.model),
        0..app.model.tensors.len(),
        options,
        sender,
    );
    for event in receiver {
        app.on_scan(event);
    }
}

fn screen(app: &mut App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| ui::render(frame, app)).unwrap();
    terminal
}

fn text(app: &mut App, width: u16, height: u16) -> String {
    screen(app, width, height).backend().to_string()
}

/// Snapshots `text`, the temporary folder's name and the scan's time in it replaced.
fn snapshot(name: &str, text: &str) {
    let filters = vec![
        (r"/tmp/\.tmp[A-Za-z0-9]{6}/", "/tmp/[folder]/"),
        (r" in [0-9.]+ s ", " in [time] s "),
    ];
    insta::with_settings!({filters => filters}, {
        insta::assert_snapshot!(name, text);
    });
}

fn name_at_cursor(app: &App) -> Option<String> {
    let view = app.map.as_ref()?;
    view.tensor_at_cursor(&app.values)
        .map(|t| app.model.tensors[t].name().to_owned())
}

#[test]
fn the_demo_is_laid_out_layers_across_and_kinds_down() {
    // Relative, so that the header (and the snapshot) does not depend on where the repository is.
    let mut app = open(Path::new("assets/demo.safetensors"), true);
    app.update(Action::ToggleMap);
    assert!(app.map_open);
    let view = app.map.as_ref().unwrap();
    assert_eq!(view.map.columns, [0, 1, 2, 3]);
    let labels: Vec<String> = view.rows.iter().map(|&r| view.map.label(r)).collect();
    assert_eq!(labels.len(), 9);
    assert_eq!(labels[0], "input_layernorm.weight");
    assert!(labels.contains(&"mlp.down_proj.weight".to_owned()));
    let strip: Vec<&str> = view
        .map
        .strip
        .iter()
        .map(|&t| app.model.tensors[t as usize].name())
        .collect();
    assert_eq!(
        strip,
        [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.norm.weight"
        ]
    );
    // Nothing scanned yet: every cell is pending, and the screen says so.
    let pending = text(&mut app, 80, 24);
    assert!(pending.contains("····"), "{pending}");
    scan(&mut app);
    let screen = text(&mut app, 80, 24);
    assert!(!screen.contains("····"), "{screen}");
    snapshot("map_demo_80x24", &screen);
}

#[test]
fn pending_cells_fill_in_as_the_scan_streams() {
    let mut app = open(&support::demo_path(), true);
    app.update(Action::ToggleMap);
    let model = Arc::clone(&app.model);
    let down = (0..model.tensors.len())
        .find(|&t| model.tensors[t].name() == "model.layers.1.mlp.down_proj.weight")
        .unwrap();
    assert_eq!(app.values.get(down, Measure::Std), State::Pending);
    app.on_scan(stui::jobs::ScanEvent::Stats {
        tensor: down,
        moments: stui::analysis::Moments::of_f32(&[0.5, -0.5]),
    });
    assert_eq!(app.values.get(down, Measure::Std), State::Value(0.5));
    let view = app.map.as_mut().unwrap();
    let row = view
        .rows
        .iter()
        .position(|&r| view.map.label(r) == "mlp.down_proj.weight")
        .unwrap();
    let screen = text(&mut app, 80, 24);
    let line = screen
        .lines()
        .find(|l| l.contains("mlp.down_proj.weight"))
        .unwrap();
    let cells: String = line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .chars()
        .take(4)
        .collect();
    let glyphs: Vec<char> = cells.chars().collect();
    assert_eq!(glyphs[0], '·', "row {row}: {line}");
    assert!(
        stui::layermap::Glyphs::UNICODE.shades.contains(&glyphs[1]),
        "{line}"
    );
    assert_eq!(&glyphs[2..], ['·', '·'], "{line}");
}

#[test]
fn the_planted_faults_are_outliers_and_findings() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = open(&planted(dir.path()), true);
    scan(&mut app);
    app.update(Action::ToggleMap);
    let view = app.map.as_mut().unwrap();
    assert_eq!(view.map.columns.len(), 61);
    let outliers = view.analysis(&app.values, true).outliers.clone();
    let named = |o: &stui::layermap::Outlier| app.model.tensors[o.tensor as usize].name();
    assert!(matches!(outliers[0].problem, Problem::NonFinite));
    assert_eq!(
        named(&outliers[0]),
        "model.layers.50.self_attn.q_proj.weight"
    );
    // By std, the dead expert (a std of 0) is the furthest from its row, then the planted layer.
    let deviants: Vec<&str> = outliers
        .iter()
        .filter(|o| matches!(o.problem, Problem::Deviant { .. }))
        .map(named)
        .collect();
    assert_eq!(
        deviants,
        [
            "model.layers.40.mlp.experts.2.up_proj.weight",
            "model.layers.30.mlp.down_proj.weight"
        ]
    );
    let dead = outliers
        .iter()
        .find(|o| matches!(o.problem, Problem::DeadExperts(_)))
        .unwrap();
    assert_eq!(dead.problem, Problem::DeadExperts(vec![2]));
    assert_eq!(named(dead), "model.layers.40.mlp.experts.2.up_proj.weight");
    let found = |code: Code, tensor: &str| {
        app.findings
            .iter(None)
            .any(|f| f.code == code && f.tensor.as_deref() == Some(tensor))
    };
    assert!(found(
        Code::ValuesNan,
        "model.layers.50.self_attn.q_proj.weight"
    ));
    assert!(found(
        Code::LayerOutlier,
        "model.layers.30.mlp.down_proj.weight"
    ));
    assert!(found(
        Code::ExpertDead,
        "model.layers.40.mlp.experts.2.up_proj.weight"
    ));

    // n visits them in the list's order; Enter lands on the tensor in the tree, M goes back.
    app.update(Action::NextProblem);
    assert_eq!(
        name_at_cursor(&app).as_deref(),
        Some("model.layers.50.self_attn.q_proj.weight")
    );
    app.update(Action::NextProblem);
    app.update(Action::NextProblem);
    assert_eq!(
        name_at_cursor(&app).as_deref(),
        Some("model.layers.30.mlp.down_proj.weight")
    );
    let (_, effect) = app.update(Action::MapJump);
    assert!(!app.map_open);
    let selected = app.selected_tensor().unwrap();
    assert_eq!(
        app.model.tensors[selected].name(),
        "model.layers.30.mlp.down_proj.weight"
    );
    assert!(effect.is_some(), "the tensor's statistics are asked for");
    app.update(Action::ToggleMap);
    assert_eq!(
        name_at_cursor(&app).as_deref(),
        Some("model.layers.30.mlp.down_proj.weight"),
        "the map opens on the tree's selection"
    );
}

#[test]
fn the_planted_model_on_screen_in_colour_and_without() {
    let dir = tempfile::tempdir().unwrap();
    for colored in [true, false] {
        let mut app = open(&planted(dir.path()), colored);
        scan(&mut app);
        app.update(Action::ToggleMap);
        app.update(Action::NextProblem);
        let suffix = if colored { "colour" } else { "no_color" };
        for (width, height) in [(80, 24), (200, 60)] {
            let terminal = screen(&mut app, width, height);
            let buffer = terminal.backend().buffer();
            // The NaN cell: the error style whatever the measure, reverse video without colour.
            let nan = (0..height)
                .find_map(|y| {
                    let symbols: Vec<&str> = (0..width).map(|x| buffer[(x, y)].symbol()).collect();
                    let row = symbols.concat();
                    let x = symbols.iter().position(|s| *s == "!")?;
                    row.contains("│self_attn.q_proj.weight")
                        .then(|| &buffer[(u16::try_from(x).unwrap(), y)])
                })
                .unwrap_or_else(|| panic!("no NaN cell at {width}x{height}"));
            if colored {
                assert_eq!(nan.fg, Color::Red);
            } else {
                assert!(nan.modifier.contains(Modifier::REVERSED));
                assert!(
                    buffer
                        .content()
                        .iter()
                        .all(|c| c.fg == Color::Reset && c.bg == Color::Reset),
                    "no colour at all"
                );
            }
            snapshot(
                &format!("map_planted_{suffix}_{width}x{height}"),
                &terminal.backend().to_string(),
            );
        }
    }
}

#[test]
fn experts_expand_to_a_row_each_and_the_cursor_scrolls_sideways() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = open(&planted(dir.path()), true);
    scan(&mut app);
    app.update(Action::ToggleMap);
    let folded = app.map.as_ref().unwrap().rows.len();
    app.update(Action::MapExperts);
    assert_eq!(app.map.as_ref().unwrap().rows.len(), folded + 3);
    for _ in 0..60 {
        app.update(Action::Right);
    }
    for _ in 0..4 {
        app.update(Action::Down);
    }
    let screen = text(&mut app, 80, 24);
    assert!(
        screen.contains("layer 60 · model.layers.60.mlp.experts.2.up_proj.weight"),
        "{screen}"
    );
    snapshot("map_experts_scrolled_80x24", &screen);
    // Tab cycles the measures that have values; / filters rows.
    app.update(Action::MapMeasure);
    assert_eq!(app.map.as_ref().unwrap().measure, Measure::Absmax);
    app.update(Action::StartSearch);
    for c in "q_proj".chars() {
        app.update(Action::SearchType(c));
    }
    app.update(Action::SearchAccept);
    let view = app.map.as_ref().unwrap();
    assert_eq!(view.rows.len(), 1);
    assert_eq!(view.map.label(view.rows[0]), "self_attn.q_proj.weight");
}

#[test]
fn stats_map_prints_the_grid_the_legend_and_the_outliers() {
    let dir = tempfile::tempdir().unwrap();
    planted(dir.path());
    let filters = vec![(r"[0-9.]+ KiB scanned", "[size] scanned")];
    for args in [
        &["stats", "--map", "planted.safetensors"][..],
        &[
            "stats",
            "--map",
            "--ascii",
            "--measure",
            "absmax",
            "planted.safetensors",
        ],
        &[
            "stats",
            "--map",
            "--experts",
            "--measure",
            "zeros",
            "planted.safetensors",
        ],
    ] {
        let (code, text) = crate::cli::run(dir.path(), args);
        assert_eq!(code, 1, "the model holds a NaN");
        insta::with_settings!({filters => filters.clone(), snapshot_suffix => args[2..].join("_")}, {
            insta::assert_snapshot!("stats_map", text);
        });
    }
    let (_, text) = crate::cli::run(dir.path(), &["stats", "planted.safetensors"]);
    assert!(text.contains("expert-dead"), "{text}");
}

/// A model of one layer and one kind of tensor is counted in the singular.
#[test]
fn stats_map_counts_one_layer_and_one_row() {
    use stui::demo::{Fill, SyntheticModel};
    let dir = tempfile::tempdir().unwrap();
    SyntheticModel::new(3)
        .tensor(
            "model.layers.0.mlp.down_proj.weight",
            stui::format::Dtype::F32,
            &[8, 8],
            Fill::Normal {
                mean: 0.0,
                std: 0.02,
            },
        )
        .write(&dir.path().join("one.safetensors"))
        .unwrap();
    let (code, printed) = crate::cli::run(dir.path(), &["stats", "--map", "one.safetensors"]);
    assert_eq!(code, 0, "{printed}");
    assert!(
        printed.contains("one.safetensors: layer map by std, 1 layer x 1 row, "),
        "{printed}"
    );
    let mut app = open(&dir.path().join("one.safetensors"), false);
    scan(&mut app);
    app.update(Action::ToggleMap);
    let screen = text(&mut app, 80, 24);
    assert!(
        screen.contains("layer map · std · 1 layer x 1 row"),
        "{screen}"
    );
}

#[test]
fn stats_map_json_gives_the_grid_as_numbers() {
    let dir = tempfile::tempdir().unwrap();
    planted(dir.path());
    let (code, text) = crate::cli::run(
        dir.path(),
        &["stats", "--map", "--json", "planted.safetensors"],
    );
    assert_eq!(code, 1);
    let json: serde_json::Value =
        serde_json::from_str(text.splitn(3, '\n').nth(2).unwrap()).unwrap();
    assert_eq!(json["measure"], "std");
    assert_eq!(json["columns"].as_array().unwrap().len(), 61);
    let rows = json["rows"].as_array().unwrap();
    let down = rows
        .iter()
        .find(|r| r["label"] == "mlp.down_proj.weight")
        .unwrap();
    let values: Vec<f64> = down["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let (planted, neighbour) = (values[30], values[29]);
    assert!(
        (8.0..12.0).contains(&(planted / neighbour)),
        "{planted} {neighbour}"
    );
    let q = rows
        .iter()
        .find(|r| r["label"] == "self_attn.q_proj.weight")
        .unwrap();
    assert!(q["values"][50].is_null());
    assert_eq!(q["problems"][0], serde_json::json!([50, "nan-or-inf"]));
    let kinds: Vec<&str> = json["outliers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "nan-or-inf");
    assert!(kinds.contains(&"deviant") && kinds.contains(&"dead-experts"));
    let codes: Vec<&str> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    for code in ["values-nan", "layer-outlier", "expert-dead"] {
        assert!(codes.contains(&code), "{codes:?}");
    }
}

#[test]
fn the_quantize_preview_s_snr_becomes_a_measure() {
    let mut app = open(Path::new("assets/demo.safetensors"), true);
    scan(&mut app);
    app.update(Action::ToggleMap);
    let measures = |app: &mut App| {
        let mut seen = Vec::new();
        for _ in 0..6 {
            app.update(Action::MapMeasure);
            let measure = app.map.as_ref().unwrap().measure;
            if !seen.contains(&measure) {
                seen.push(measure);
            }
        }
        seen
    };
    assert_eq!(measures(&mut app).len(), 4, "no diff, no preview");
    let tensor = (0..app.model.tensors.len())
        .find(|&t| app.model.tensors[t].name() == "model.layers.1.mlp.up_proj.weight")
        .unwrap();
    let error = stui::quantize::Error8 {
        snr_db: 38.5,
        max_abs_error: 1e-3,
        relative_rms_error: 1e-2,
        max_error_in_scales: 0.5,
    };
    app.on_preview(
        tensor,
        stui::quantize::Granularity::PerChannel,
        Ok(Some(error)),
    );
    assert!(measures(&mut app).contains(&Measure::Snr));
    while app.map.as_ref().unwrap().measure != Measure::Snr {
        app.update(Action::MapMeasure);
    }
    assert_eq!(app.values.get(tensor, Measure::Snr), State::Value(38.5));
    let screen = text(&mut app, 80, 24);
    assert!(screen.contains("layer map · snr"), "{screen}");
}

#[test]
fn the_map_in_tiny_terminals_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = open(&planted(dir.path()), true);
    app.update(Action::ToggleMap);
    app.update(Action::MapExperts);
    for (width, height) in [(0, 0), (20, 8), (30, 9), (40, 10), (60, 12), (119, 14)] {
        for _ in 0..3 {
            app.update(Action::Right);
            app.update(Action::Down);
            screen(&mut app, width, height);
        }
    }
}

/// 24 layers of an encoder and a decoder stack, four kinds each, std 0.02; the decoder's layers
/// 10-13 have a std four times that, and the embeddings (outside layers) hold a NaN.
fn banded(dir: &Path) -> std::path::PathBuf {
    use stui::demo::{Fill, SyntheticModel};
    use stui::format::Dtype;
    let weight = |std| Fill::Normal { mean: 0.0, std };
    let mut model = SyntheticModel::new(7).tensor(
        "model.embed_tokens.weight",
        Dtype::F32,
        &[32, 16],
        weight(0.02),
    );
    for stack in ["encoder", "decoder"] {
        for layer in 0..24 {
            let std = if stack == "decoder" && (10..14).contains(&layer) {
                0.08
            } else {
                0.02
            };
            for kind in [
                "self_attn.q_proj",
                "self_attn.k_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            ] {
                let name = format!("model.{stack}.layers.{layer}.{kind}.weight");
                model = model.tensor(&name, Dtype::F32, &[16, 16], weight(std));
            }
        }
    }
    let path = dir.join("banded.safetensors");
    model
        .plant("model.embed_tokens.weight", 5, f64::NAN)
        .tensor("lm_head.weight", Dtype::F32, &[32, 16], weight(0.02))
        .write(&path)
        .unwrap();
    path
}

#[test]
fn a_band_of_layers_is_named_in_its_stack_and_a_nan_outside_layers_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = open(&banded(dir.path()), true);
    scan(&mut app);
    app.update(Action::ToggleMap);
    let view = app.map.as_mut().unwrap();
    // The encoder's and the decoder's layers are rows of their own, not one column of both.
    let labels: Vec<String> = view.rows.iter().map(|&r| view.map.label(r)).collect();
    assert_eq!(labels.len(), 8, "{labels:?}");
    assert!(
        labels[..4]
            .iter()
            .all(|l| l.starts_with("model.decoder.layers.*."))
    );
    assert!(
        labels[4..]
            .iter()
            .all(|l| l.starts_with("model.encoder.layers.*."))
    );
    let rows = view.rows.clone();
    let outliers = view.analysis(&app.values, true).outliers.clone();
    let view = app.map.as_ref().unwrap();
    let described: Vec<String> = outliers
        .iter()
        .map(|o| stui::layermap::analysis::Described(o, &view.map, &rows, Measure::Std).to_string())
        .collect();
    // The NaN outside layers heads the list, where the strip shows it.
    let embeddings = view
        .map
        .strip
        .iter()
        .position(|&t| app.model.tensors[t as usize].name() == "model.embed_tokens.weight")
        .unwrap();
    assert_eq!(outliers[0].problem, Problem::NonFinite);
    assert_eq!(
        outliers[0].spot,
        stui::layermap::analysis::Spot::Strip(embeddings)
    );
    let bands: Vec<(usize, &str)> = outliers
        .iter()
        .zip(&described)
        .filter(|(o, _)| matches!(o.problem, Problem::Band { .. }))
        .map(|(o, d)| (o.cell().unwrap().0, d.as_str()))
        .collect();
    assert_eq!(bands.len(), 1, "{described:#?}");
    assert_eq!(bands[0].0, 0, "at the decoder's first row");
    assert!(
        bands[0]
            .1
            .starts_with("layers 10-13: most of 4 rows off their medians by std"),
        "{}",
        bands[0].1
    );
    let findings: Vec<&stui::finding::Finding> = app.findings.iter(None).collect();
    assert!(
        findings
            .iter()
            .any(|f| f.code == Code::LayerBand
                && f.message.starts_with("layers 10-13: most of 4 rows")),
        "{findings:#?}"
    );
    assert!(
        findings.iter().any(|f| f.code == Code::ValuesNan
            && f.tensor.as_deref() == Some("model.embed_tokens.weight"))
    );

    // n goes to the NaN in the strip first, where the cursor line names it; Enter jumps to it.
    app.update(Action::NextProblem);
    assert!(app.map.as_ref().unwrap().in_strip);
    let screen = screen(&mut app, 80, 24);
    let text = screen.backend().to_string();
    assert!(
        text.contains("outside layers · model.embed_tokens.weight · std NaN/Inf"),
        "{text}"
    );
    let buffer = screen.backend().buffer();
    let strip_line = text
        .lines()
        .position(|l| l.contains("outside layers:"))
        .unwrap();
    let mark = (0..80)
        .map(|x| &buffer[(x, u16::try_from(strip_line).unwrap())])
        .find(|c| c.symbol() == "!")
        .expect("the NaN's mark in the strip");
    assert_eq!(mark.fg, Color::Red);
    app.update(Action::MapJump);
    assert!(!app.map_open);
    let selected = app.selected_tensor().unwrap();
    assert_eq!(
        app.model.tensors[selected].name(),
        "model.embed_tokens.weight"
    );
}

#[test]
fn the_strip_takes_the_cursor_from_the_grid_s_last_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = open(&planted(dir.path()), true);
    scan(&mut app);
    app.update(Action::ToggleMap);
    // The tree starts on `lm_head.weight`, outside layers: the map opens on its grid.
    assert!(!app.map.as_ref().unwrap().in_strip);
    let rows = app.map.as_ref().unwrap().rows.len();
    for _ in 0..rows {
        app.update(Action::Down);
    }
    let view = app.map.as_ref().unwrap();
    assert!(view.in_strip);
    assert_eq!(name_at_cursor(&app).as_deref(), Some("lm_head.weight"));
    app.update(Action::Right);
    assert_eq!(
        name_at_cursor(&app).as_deref(),
        Some("model.embed_tokens.weight")
    );
    for _ in 0..5 {
        app.update(Action::Right);
    }
    assert_eq!(name_at_cursor(&app).as_deref(), Some("model.norm.weight"));
    // Narrow, the strip scrolls so that the cursor's tensor is in view.
    let text = text(&mut app, 60, 24);
    let strip = text
        .lines()
        .find(|l| l.contains("outside layers:"))
        .unwrap();
    assert!(strip.contains("model.norm.weight"), "{strip}");
    assert!(strip.contains('…'), "{strip}");
    app.update(Action::Up);
    assert!(!app.map.as_ref().unwrap().in_strip);
    assert_eq!(app.map.as_ref().unwrap().cursor.0, rows - 1);
}

#[test]
fn with_a_diff_the_change_is_a_measure_and_the_changed_tensor_stands_out() {
    let dir = tempfile::tempdir().unwrap();
    let changed = "model.layers.17.mlp.down_proj.weight";
    let other_path = dir.path().join("other.safetensors");
    support::planted_layers()
        .plant(changed, 0, 3.0)
        .write(&other_path)
        .unwrap();
    let mut app = open(&planted(dir.path()), true);
    scan(&mut app);
    let diff = support::stored_diff(&app.model, &other_path);
    app.on_diff(&diff);
    app.update(Action::ToggleMap);
    while app.map.as_ref().unwrap().measure != Measure::Change {
        app.update(Action::MapMeasure);
    }
    let view = app.map.as_mut().unwrap();
    let outliers = view.analysis(&app.values, true).outliers.clone();
    let deviant = outliers
        .iter()
        .find(|o| matches!(o.problem, Problem::Deviant { .. }))
        .unwrap();
    assert_eq!(app.model.tensors[deviant.tensor as usize].name(), changed);
    let tensor = deviant.tensor as usize;
    let State::Value(change) = app.values.get(tensor, Measure::Change) else {
        panic!("no change recorded for {changed}");
    };
    assert!(change > 0.1, "{change}");
    let view = app.map.as_mut().unwrap();
    view.show_tensor(tensor);
    let text = text(&mut app, 200, 60);
    assert!(text.contains("layer map · change"), "{text}");
    assert!(
        text.contains(&format!("layer 17 · {changed} · change {change:.3e}")),
        "{text}"
    );
    // Unchanged tensors are measured too: a change of zero, not a missing value.
    let unchanged = (0..app.model.tensors.len())
        .find(|&t| app.model.tensors[t].name() == "model.layers.16.mlp.down_proj.weight")
        .unwrap();
    assert_eq!(
        app.values.get(unchanged, Measure::Change),
        State::Value(0.0)
    );
}
