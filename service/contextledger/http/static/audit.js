// The seq picker: show exactly what a request built right after that seq carried.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const picker = document.getElementById("seq");
  const list = document.getElementById("request");
  const title = document.querySelector("h1[data-session]");
  if (!picker || !list || !title) return;
  const session = encodeURIComponent(title.dataset.session);
  const render = (messages) => {
    list.replaceChildren(...messages.map((m) => {
      const li = document.createElement("li");
      li.className = "msg role-" + m.role;
      const role = document.createElement("b");
      role.textContent = m.role;
      let text = typeof m.content === "string" ? m.content
        : Array.isArray(m.content) ? m.content.map((b) => b.text ?? `[${b.type}]`).join(" ") : "";
      if (m.tool_calls) text += " → calls " + m.tool_calls.map((c) => c.function.name).join(", ");
      li.append(role, " " + text.trim());
      return li;
    }));
    if (!messages.length) list.innerHTML = "<li class=empty>(nothing)</li>";
  };
  const mark = (seq) => document.querySelectorAll("#timeline li").forEach((li) =>
    li.classList.toggle("picked", Number(li.dataset.seq) === seq));
  picker.addEventListener("change", async () => {
    const seq = Number(picker.value);
    list.setAttribute("aria-busy", "true");
    const r = await fetch(`/v1/sessions/${session}/context?at=${seq}`, { credentials: "same-origin" });
    const body = await r.json();
    render(r.ok ? body.messages : []);
    mark(seq);
    list.dataset.at = String(seq);
    list.removeAttribute("aria-busy");
  });
  document.querySelectorAll("#timeline li").forEach((li) => li.addEventListener("click", () => {
    picker.value = li.dataset.seq;
    picker.dispatchEvent(new Event("change"));
  }));
});
