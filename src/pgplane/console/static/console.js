// The console's few lines of script: copy buttons, confirmations, the connection-string
// chooser, and the live part of a page, fetched again every second while anything on it is
// unsettled (no reload, no framework). Everything works without it but the live refresh.
"use strict";

document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const text = document.querySelector(button.dataset.copy).textContent.trim();
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const range = document.createRange();
    range.selectNodeContents(document.querySelector(button.dataset.copy));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    document.execCommand("copy");
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 2000);
});

document.addEventListener("submit", (event) => {
  const message = event.target.dataset.confirm;
  if (message && !confirm(message)) event.preventDefault();
});

document.addEventListener("change", (event) => {
  const form = event.target.closest("form[data-autosubmit]");
  if (form) form.submit();
});

async function refresh() {
  const live = document.getElementById("live");
  if (live && live.dataset.live === "true") {
    try {
      const response = await fetch(live.dataset.refresh, {
        headers: { "X-Pgplane-Fragment": "1" },
        credentials: "same-origin",
      });
      if (response.ok) {
        const open = new Set([...live.querySelectorAll("details[open]")].map((d) => d.textContent));
        live.outerHTML = await response.text();
        document.querySelectorAll("#live details").forEach((d) => {
          if (open.has(d.textContent)) d.open = true;
        });
      }
    } catch {
      // The server is restarting, say: try again at the next tick.
    }
  }
  setTimeout(refresh, 1000);
}
setTimeout(refresh, 1000);
