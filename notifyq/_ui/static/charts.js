// The overview's charts (uPlot): the last hour per minute, refreshed every 10 s. Times in UTC,
// like every other time on the dashboard (uPlot's default is the browser's time zone).
(function () {
  "use strict";
  const REFRESH_MS = 10000;
  const styles = getComputedStyle(document.documentElement);
  const color = (name) => styles.getPropertyValue(name).trim();

  const utc = (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC");
  const minute = () => ({ value: (u, ts) => ts == null ? "--"
    : new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC" });

  const kinds = {
    throughput: {
      series: [minute(), { label: "completed/s", stroke: color("--ok"), width: 2 },
               { label: "failed/s", stroke: color("--bad"), width: 2 }],
      columns: (d) => [d.t, d.completed, d.failed],
    },
    latency: {
      series: [minute(), { label: "p50 s", stroke: color("--accent"), width: 2 },
               { label: "p95 s", stroke: color("--warn"), width: 2 }],
      columns: (d) => [d.t, d.p50, d.p95],
    },
  };

  function axes() {
    const grid = { stroke: color("--line"), width: 1 };
    const axis = { stroke: color("--muted"), grid: grid, ticks: grid };
    return [axis, Object.assign({}, axis, { size: 50 })];
  }

  function mount(el) {
    const kind = kinds[el.dataset.chart];
    let plot = null;
    async function load() {
      const response = await fetch(el.dataset.src, { credentials: "same-origin" });
      if (!response.ok) return;
      const columns = kind.columns(await response.json());
      if (plot === null) {
        plot = new uPlot({ width: el.clientWidth || 400, height: 220, series: kind.series, tzDate: utc,
                           axes: axes(), scales: { y: { range: (u, min, max) => [0, Number.isFinite(max) && max > 0 ? max * 1.1 : 1] } } },
                         columns, el);
        new ResizeObserver(() => plot.setSize({ width: el.clientWidth, height: 220 })).observe(el);
      } else {
        plot.setData(columns);
      }
    }
    load();
    setInterval(load, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-chart]").forEach(mount);
  });
})();
