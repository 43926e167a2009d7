// The live gauge's page: one self-contained document (nothing fetched from elsewhere) with a
// speedometer of the current rate and a rolling chart of the last five minutes, fed by the
// server's event stream (/events). Sized by the viewport: a phone or a wall screen.
#pragma once

namespace ferry::cli {

inline constexpr const char* kGaugePage = R"PAGE(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Ferry gauge</title>
<style>
  html, body { margin: 0; height: 100%; background: #10151c; color: #e8eef5;
               font-family: system-ui, sans-serif; }
  main { display: flex; flex-direction: column; align-items: center; justify-content: center;
         min-height: 100%; gap: 2vmin; padding: 2vmin; box-sizing: border-box; }
  h1 { margin: 0; font-size: max(16px, 3vmin); font-weight: 500; color: #9fb3c8; }
  #dial { width: min(90vw, 70vmin); height: auto; }
  #value { font-size: max(28px, 9vmin); font-weight: 700; font-variant-numeric: tabular-nums; }
  #unit { font-size: max(14px, 3.5vmin); color: #9fb3c8; }
  #chart { width: min(95vw, 160vmin); height: max(120px, 25vmin); }
  #status { font-size: max(12px, 2vmin); color: #6f8397; }
</style>
</head>
<body>
<main>
  <h1 id="title">Ferry</h1>
  <svg id="dial" viewBox="0 0 200 120" role="img" aria-label="current rate">
    <path d="M 20 110 A 80 80 0 0 1 180 110" fill="none" stroke="#2a3644" stroke-width="14"
          stroke-linecap="round"/>
    <path id="arc" d="M 20 110 A 80 80 0 0 1 180 110" fill="none" stroke="#37c8ab"
          stroke-width="14" stroke-linecap="round" pathLength="100" stroke-dasharray="0 100"/>
    <line id="needle" x1="100" y1="110" x2="100" y2="40" stroke="#e8eef5" stroke-width="3"
          stroke-linecap="round" transform="rotate(-90 100 110)"/>
    <circle cx="100" cy="110" r="5" fill="#e8eef5"/>
    <text id="scale" x="180" y="119" font-size="8" fill="#6f8397" text-anchor="middle"></text>
  </svg>
  <div><span id="value">0</span> <span id="unit">MB/s</span></div>
  <canvas id="chart"></canvas>
  <div id="status">connecting</div>
</main>
<script>
"use strict";
const keep = 5 * 60 * 4;  // five minutes of samples at four a second
const samples = [];
let scale = 1e8;           // the dial's full scale, in bytes per second
let count = 0, since = performance.now();

function units(rate) {
  if (rate >= 1e9) return [rate / 1e9, "GB/s"];
  if (rate >= 1e6) return [rate / 1e6, "MB/s"];
  if (rate >= 1e3) return [rate / 1e3, "KB/s"];
  return [rate, "B/s"];
}
// 1, 2 or 5 times a power of ten, at least `rate`: the dial grows with the peak.
function niceAbove(rate) {
  let p = Math.pow(10, Math.floor(Math.log10(Math.max(rate, 1))));
  for (const m of [1, 2, 5, 10]) if (m * p >= rate) return m * p;
  return 10 * p;
}
function draw(rate) {
  const peak = Math.max(rate, ...samples.map(s => s.rate));
  if (peak > scale || peak < scale / 10) scale = niceAbove(peak);
  const share = Math.min(rate / scale, 1);
  document.getElementById("arc").setAttribute("stroke-dasharray", (share * 100) + " 100");
  document.getElementById("needle").setAttribute("transform",
      "rotate(" + (-90 + 180 * share) + " 100 110)");
  const [v, u] = units(rate);
  document.getElementById("value").textContent = v.toFixed(v < 10 ? 2 : 1);
  document.getElementById("unit").textContent = u;
  const [sv, su] = units(scale);
  document.getElementById("scale").textContent = sv + " " + su;

  const canvas = document.getElementById("chart");
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth * ratio, h = canvas.clientHeight * ratio;
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, w, h);
  g.strokeStyle = "#2a3644";
  g.strokeRect(0, 0, w, h);
  g.beginPath();
  samples.forEach((s, i) => {
    const x = w - (samples.length - 1 - i) * w / (keep - 1);
    const y = h - Math.min(s.rate / scale, 1) * (h - 4) - 2;
    if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
  });
  g.strokeStyle = "#37c8ab";
  g.lineWidth = 2 * ratio;
  g.stroke();
}
const events = new EventSource("events");
events.onmessage = (e) => {
  const m = JSON.parse(e.data);
  document.getElementById("title").textContent = m.title;
  document.title = m.title + " - Ferry gauge";
  samples.push({ t: m.t, rate: m.rate });
  if (samples.length > keep) samples.shift();
  draw(m.rate);
  count++;
  const now = performance.now();
  if (now - since >= 2000) {
    document.getElementById("status").textContent =
        "live, " + (count * 1000 / (now - since)).toFixed(1) + " updates/s";
    count = 0;
    since = now;
  }
};
events.onerror = () => { document.getElementById("status").textContent = "reconnecting"; };
window.onresize = () => draw(samples.length ? samples[samples.length - 1].rate : 0);
</script>
</body>
</html>
)PAGE";

}  // namespace ferry::cli
