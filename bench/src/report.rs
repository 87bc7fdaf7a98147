//! The sale's report as a table, and its timeline as an SVG (the chart helper the
//! soak draws with too).

use std::path::Path;

use crate::audit::Audit;
use crate::room::RoomReport;
use crate::train::TrainReport;
use crate::{record, sale};

pub fn print_sale(r: &sale::SaleReport) {
    println!(
        "sale: event {}, {} buyers for {} units over {} connections",
        r.event_id, r.buyers, r.units, r.connections
    );
    println!(
        "  requests          {:>10}  in {:.2} s = {:.0}/s (every buyer's first answer after {:.2} s)",
        r.requests, r.burst_s, r.requests_per_s, r.first_answers_s
    );
    println!(
        "  admitted (202)    {:>10}  = {:.0}/s",
        r.admitted, r.admitted_per_s
    );
    println!(
        "  orders in MySQL   {:>10}  = {:.0}/s from the first request to settled",
        r.orders, r.orders_persisted_per_s
    );
    println!(
        "  settled           {:>10.2} s after the last answer ({:.2} s until every reservation was an order, the rest stock sync)",
        r.settle_s, r.created_s
    );
    if r.errors > 0 {
        println!("  transport errors  {:>10}", r.errors);
    }
    println!(
        "  {:<24} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "answer", "count", "p50 ms", "p95 ms", "p99 ms", "max ms"
    );
    for (kind, l) in &r.latency {
        println!(
            "  {:<24} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            kind, l.count, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
        );
    }
    if let Some(race) = &r.pay_race {
        println!(
            "  pay race: {} orders paid at their deadline: answered {:?}; ended paid {}, cancelled {}",
            race.raced, race.answers, race.ended_paid, race.ended_cancelled
        );
    }
    println!(
        "  Redis ({} bucket{}): {:.1} µs of CPU per admission (every node){}",
        r.buckets,
        if r.buckets == 1 { "" } else { "s" },
        r.redis_cpu_us_per_admission,
        r.masters_spread
            .map(|s| format!("; masters' EVALSHA spread {:.0} % of the mean", s * 100.0))
            .unwrap_or_default()
    );
    if !r.cpu_us_per_order.is_empty() {
        println!(
            "  CPU per order, from the open until settled: {} (all {:.1} µs)",
            crate::cpu::line(&r.cpu_us_per_order),
            r.cpu_us_per_order.values().sum::<f64>()
        );
    }
    if r.redis_nodes.len() > 1 {
        for n in &r.redis_nodes {
            println!(
                "    {:<20} {:<7} {:>9} EVALSHA  {:>7.2} s CPU",
                n.node, n.role, n.evalsha_calls, n.cpu_s
            );
        }
    }
    if let Some(t) = &r.train {
        print_train(t);
    }
    if let Some(w) = &r.waiting_room {
        print_room(w);
    }
    print_audit(&r.audit);
}

/// The audit's verdict, each check, and the offending rows.
pub fn print_audit(audit: &Audit) {
    println!(
        "  audit: {}",
        if audit.ok {
            "every invariant held"
        } else {
            "VIOLATED"
        }
    );
    for (check, held) in &audit.checks {
        println!("    {} {check}", if *held { "ok  " } else { "FAIL" });
    }
    for v in &audit.violations {
        println!("    {v}");
    }
}

fn print_train(t: &TrainReport) {
    let pct = |x: f64| x * 100.0;
    println!(
        "  train: {} stations, {} seats ({} × {}), {} seat-segments",
        t.stations, t.seats, t.carriages, t.seats_per_carriage, t.seat_segments_total
    );
    println!(
        "    journeys decided  {:>8}  asking {} seat-segments; {} heard SOLD_OUT",
        t.requests, t.demanded, t.sold_out
    );
    println!(
        "    Stampede sold     {:>8}  seat-segments = {:.1} % of the train, {:.1} % of demand{}",
        t.sold,
        pct(t.utilisation),
        pct(t.sold_of_demanded),
        if t.held == t.sold {
            String::new()
        } else {
            format!(" ({} still held)", t.held)
        }
    );
    println!(
        "    12306's counters  {:>8}  = {:.1} % of the train; {} refused, {} of them with a seat free",
        t.counters_12306_sold,
        pct(t.counters_12306_utilisation),
        t.counters_12306_refused,
        t.counters_12306_false_sold_outs
    );
    println!(
        "    exact, first fit  {:>8}  = {:.1} % of the train",
        t.first_fit_sold,
        pct(t.first_fit_sold as f64 / t.seat_segments_total.max(1) as f64)
    );
}

fn print_room(w: &RoomReport) {
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.0} ms"));
    println!(
        "  waiting room: {} per s, {} challenge bits, passes {} s, polls every {} s; opened {:.1} s after the event was made",
        w.admit_per_s, w.challenge_bits, w.pass_ttl_s, w.poll_s, w.open_in_s
    );
    println!(
        "    joined            {:>8}  before the open, {} after it, {} not ({:.0}/s over {:.2} s) {:?}",
        w.joined_early, w.joined_late, w.not_joined, w.joins_per_s, w.joins_s, w.join_answers
    );
    if let (Some(cpu), Some(s)) = (w.proof_cpu_ms, w.proofs_s) {
        println!("    proof of work     {cpu:>8.2}  ms of client CPU per place ({s:.1} s for all)");
    }
    println!(
        "    polls             {:>8}  {:.0}/s, {} answered by the edge; p99 {:.1} ms; {:?} {:?}",
        w.polls, w.polls_per_s, w.polls_from_edge, w.poll_p99_ms, w.poll_states, w.poll_answers
    );
    println!(
        "    turns             {:>8}  {} admitted, {} refused SOLD_OUT with their pass, {} passes expired, {} unfinished; SALE_BUSY {}",
        w.turns, w.admitted, w.turns_refused_sold_out, w.expired, w.unfinished, w.sale_busy
    );
    println!(
        "    sold out read     {:>8}  after the last unit by the last of {} still waiting ({} never read it); stale answers until {}",
        ms(w.sold_out_read_max_ms),
        w.sold_out_readers,
        w.sold_out_unread,
        ms(w.sold_out_stale_max_ms)
    );
    let l = &w.lottery;
    println!(
        "    lottery           {:>8}  joined; commitment {}; {} buyers' positions checked, {} wrong; {} skipped places explained by their pass; {} turns read before someone ahead's (edge workers' skew, at most {:.0} ms)",
        l.joined,
        if l.commitment_ok { "ok" } else { "WRONG" },
        l.positions_checked,
        l.positions_wrong,
        l.holes_explained,
        l.turn_inversions_within_skew,
        l.turn_inversion_max_ms
    );
    if let Some(c) = &w.edge_cpu {
        println!(
            "    edge CPU          {:>8}  poll ÷ rejection: {:.1} µs per poll ({} from the edge), {:.1} µs per SOLD_OUT ({}), {} s each",
            w.edge_cpu_poll_vs_reject
                .map_or("-".into(), |r| format!("{r:.2}")),
            c.poll_nginx_us,
            c.polls_from_edge,
            c.reject_nginx_us,
            c.rejects_sold_out,
            c.seconds_each
        );
    }
    for (target, met) in &w.targets {
        println!("    {} {target}", if *met { "met " } else { "MISS" });
    }
}

/// The sale's admissions and rejects per second over its timeline.
pub fn plot_timeline(path: &Path, timeline: &[(f64, u64, u64)]) -> anyhow::Result<()> {
    let per_s = |n: u64| n as f64 / record::BUCKET.as_secs_f64();
    let line = |label: &str, pick: fn(&(f64, u64, u64)) -> u64| Line {
        label: label.to_owned(),
        points: timeline.iter().map(|t| (t.0, per_s(pick(t)))).collect(),
    };
    plot(
        path,
        &Chart {
            caption: "admissions and rejects per second".into(),
            x_desc: "s since the sale opened".into(),
            x_max: timeline.last().map_or(1.0, |t| t.0 + 0.1),
            left: Axis {
                desc: "per second".into(),
                lines: vec![
                    line("admitted (202)", |t| t.1),
                    line("rejected (4xx/5xx)", |t| t.2),
                ],
            },
            right: None,
        },
    )
}

/// A chart of lines over time, drawn by [`plot`]: the sale's timeline, the soak's
/// memory and latency.
pub struct Chart {
    pub caption: String,
    pub x_desc: String,
    /// The right end of the time axis (it starts at 0).
    pub x_max: f64,
    pub left: Axis,
    /// Lines in another unit, against an axis on the right.
    pub right: Option<Axis>,
}

/// A y axis (from 0, so that a flat line looks flat) and the lines drawn against it.
pub struct Axis {
    pub desc: String,
    pub lines: Vec<Line>,
}

/// One line: its legend and its (x, y) points. Colours are given in order, left axis
/// first: blue, red, green, magenta.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

impl Axis {
    /// A little above the highest point, at least 1.
    fn top(&self) -> f64 {
        self.lines
            .iter()
            .flat_map(|l| &l.points)
            .map(|p| p.1)
            .fold(1.0, f64::max)
            * 1.1
    }
}

/// Draws `chart` into an SVG at `path`.
pub fn plot(path: &Path, chart: &Chart) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let right = chart.right.as_ref();
    let mut c = ChartBuilder::on(&root)
        .caption(&chart.caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .right_y_label_area_size(if right.is_some() { 60 } else { 0 })
        .build_cartesian_2d(0.0..chart.x_max, 0.0..chart.left.top())?
        .set_secondary_coord(0.0..chart.x_max, 0.0..right.map_or(1.0, Axis::top));
    c.configure_mesh()
        .x_desc(&chart.x_desc)
        .y_desc(&chart.left.desc)
        .draw()?;
    let mut colours = [BLUE, RED, GREEN, MAGENTA].into_iter().cycle();
    for line in &chart.left.lines {
        let colour = colours.next().expect("a cycle never ends");
        c.draw_series(LineSeries::new(line.points.iter().copied(), colour))?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    if let Some(axis) = right {
        c.configure_secondary_axes().y_desc(&axis.desc).draw()?;
        for line in &axis.lines {
            let colour = colours.next().expect("a cycle never ends");
            c.draw_secondary_series(LineSeries::new(line.points.iter().copied(), colour))?
                .label(&line.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        }
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
