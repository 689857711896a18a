"""Instruction templates of the task prompt sets: at most three per (task, language), instructions only.

Every passage a prompt carries is real text (see :mod:`workloads.build.task_sources`); what is written here
is only the request around it. Placeholders: ``{target}`` (a language name in the instruction's language),
``{title}`` (a real section heading of the source), ``{name}`` (a real function name), ``{new}`` (the new
name of a rename), ``{n}`` (a document's number). Reviewed for each language by the author of the builder.
"""

from __future__ import annotations

LANGUAGE_NAMES: dict[str, dict[str, str]] = {  # instruction language -> {language code: its name}
    "en": {"it": "Italian", "en": "English", "zh": "Chinese", "es": "Spanish"},
    "it": {"it": "italiano", "en": "inglese", "zh": "cinese", "es": "spagnolo"},
    "zh": {"it": "意大利语", "en": "英语", "zh": "中文", "es": "西班牙语"},
    "es": {"it": "italiano", "en": "inglés", "zh": "chino", "es": "español"},
}

SUMMARISE: dict[str, tuple[str, ...]] = {
    "en": ("Summarise the following text in a few sentences.",
           "Write a short summary of the text below for a colleague who has not read it.",
           "What are the main points of this text? Answer with a short list."),
    "it": ("Riassumi il testo seguente in poche frasi.",
           "Scrivi un breve riassunto del testo qui sotto per un collega che non l'ha letto.",
           "Quali sono i punti principali di questo testo? Rispondi con un breve elenco."),
    "zh": ("请用几句话概括下面的文字。",
           "请为没有读过下面这段文字的同事写一份简短的摘要。",
           "这段文字的要点是什么？请用一个简短的列表回答。"),
    "es": ("Resume el siguiente texto en pocas frases.",
           "Escribe un breve resumen del texto de abajo para un colega que no lo ha leído.",
           "¿Cuáles son los puntos principales de este texto? Responde con una lista breve."),
}

# Question answering over given documents (the retrieval-augmented case): {title} is the real heading of
# the section that answers; the other documents are sections of other chapters.
QA_DOCUMENT = {"en": "Document {n}:", "it": "Documento {n}:", "zh": "文档 {n}：", "es": "Documento {n}:"}
QA: dict[str, tuple[str, ...]] = {
    "en": ("Using only the documents above, answer this question: what do they say about “{title}”?",
           "According to the documents above, what should a reader know about “{title}”? Cite the document "
           "you rely on.",
           "Answer from the documents above alone: explain “{title}”. If they do not say, answer that they "
           "do not."),
    "it": ("Usando solo i documenti qui sopra, rispondi a questa domanda: che cosa dicono a proposito di "
           "«{title}»?",
           "Secondo i documenti qui sopra, che cosa deve sapere un lettore su «{title}»? Indica il documento "
           "su cui ti basi.",
           "Rispondi basandoti soltanto sui documenti qui sopra: spiega «{title}». Se non lo dicono, "
           "rispondi che non lo dicono."),
    "zh": ("请只根据上面的文档回答：关于“{title}”，它们说了什么？",
           "根据上面的文档，读者应该了解关于“{title}”的哪些内容？请注明你所依据的文档。",
           "请只依据上面的文档回答：解释“{title}”。如果文档没有提到，请回答没有提到。"),
    "es": ("Usando solo los documentos de arriba, responde a esta pregunta: ¿qué dicen sobre «{title}»?",
           "Según los documentos de arriba, ¿qué debe saber un lector sobre «{title}»? Indica el documento "
           "en el que te basas.",
           "Responde basándote únicamente en los documentos de arriba: explica «{title}». Si no lo dicen, "
           "responde que no lo dicen."),
}

TRANSLATE: dict[str, tuple[str, ...]] = {
    "en": ("Translate the following text into {target}.",
           "Please translate this passage into {target}, keeping its formatting.",
           "Give a {target} translation of the text below."),
    "it": ("Traduci il testo seguente in {target}.",
           "Per favore, traduci questo brano in {target}, mantenendo la formattazione.",
           "Fornisci una traduzione in {target} del testo qui sotto."),
    "zh": ("请把下面的文字翻译成{target}。",
           "请将这段文字翻译成{target}，并保留原有格式。",
           "请给出下面这段文字的{target}译文。"),
    "es": ("Traduce el siguiente texto al {target}.",
           "Por favor, traduce este fragmento al {target}, manteniendo el formato.",
           "Da una traducción al {target} del texto de abajo."),
}

# Rewriting, the copy-heavy case: one template per edit (proofread a passage with injected spelling errors,
# change the register, reformat as a list).
REWRITE_EDITS = ("proofread", "register", "list")
REWRITE: dict[str, tuple[str, ...]] = {
    "en": ("Correct the spelling mistakes in the following text and change nothing else.",
           "Rewrite the following text in an informal, conversational tone, keeping all of its content.",
           "Reformat the following text as a bulleted list, one point per sentence."),
    "it": ("Correggi gli errori di ortografia nel testo seguente senza cambiare nient'altro.",
           "Riscrivi il testo seguente con un tono informale e colloquiale, mantenendone tutto il contenuto.",
           "Riformatta il testo seguente come un elenco puntato, un punto per ogni frase."),
    "zh": ("请改正下面文字中的错别字，其他内容不要改动。",
           "请用轻松、口语化的语气改写下面的文字，保留全部内容。",
           "请把下面的文字改写成项目符号列表，每句话一项。"),
    "es": ("Corrige las faltas de ortografía del siguiente texto sin cambiar nada más.",
           "Reescribe el siguiente texto con un tono informal y coloquial, conservando todo su contenido.",
           "Da al siguiente texto el formato de una lista con viñetas, un punto por cada frase."),
}

# Code editing on real source: one template per edit (rename, add a parameter, add a docstring).
CODE_EDITS = ("rename", "parameter", "docstring")
CODE: dict[str, tuple[str, ...]] = {
    "en": ("Rename the function `{name}` to `{new}` in the code below and update every reference to it.",
           "Add a keyword-only parameter `verbose: bool = False` to the function `{name}` below. When it is "
           "true, the function logs its arguments with the `logging` module; otherwise its behaviour does "
           "not change. Show the whole edited code.",
           "Add a docstring to the function `{name}` below that describes its parameters and its return "
           "value. Show the whole edited code."),
    "it": ("Rinomina la funzione `{name}` in `{new}` nel codice qui sotto e aggiorna ogni riferimento a essa.",
           "Aggiungi alla funzione `{name}` qui sotto un parametro solo keyword `verbose: bool = False`. "
           "Quando è vero, la funzione registra i suoi argomenti con il modulo `logging`; altrimenti il suo "
           "comportamento non cambia. Mostra tutto il codice modificato.",
           "Aggiungi alla funzione `{name}` qui sotto una docstring che ne descriva i parametri e il valore "
           "restituito. Mostra tutto il codice modificato."),
    "zh": ("请把下面代码中的函数 `{name}` 重命名为 `{new}`，并更新所有对它的引用。",
           "请给下面的函数 `{name}` 添加一个仅限关键字的参数 `verbose: bool = False`。当它为真时，函数用 "
           "`logging` 模块记录它的参数；否则函数的行为不变。请给出修改后的完整代码。",
           "请给下面的函数 `{name}` 添加文档字符串，说明它的参数和返回值。请给出修改后的完整代码。"),
    "es": ("Cambia el nombre de la función `{name}` a `{new}` en el código de abajo y actualiza todas las "
           "referencias a ella.",
           "Añade a la función `{name}` de abajo un parámetro solo de palabra clave `verbose: bool = False`. "
           "Cuando sea verdadero, la función registra sus argumentos con el módulo `logging`; si no, su "
           "comportamiento no cambia. Muestra todo el código editado.",
           "Añade a la función `{name}` de abajo una docstring que describa sus parámetros y su valor de "
           "retorno. Muestra todo el código editado."),
}

# Multi-turn chat about a manual: every user turn asks about a real section heading ({title}); the assistant
# turns before the last question are the manual's own text of that section.
CHAT: dict[str, tuple[str, ...]] = {
    "en": ("Can you tell me about “{title}”?", "What about “{title}”?", "And “{title}”: how does that work?"),
    "it": ("Mi parli di «{title}»?", "E per quanto riguarda «{title}»?", "E «{title}»: come funziona?"),
    "zh": ("能给我讲讲“{title}”吗？", "那“{title}”呢？", "还有“{title}”：它是怎么回事？"),
    "es": ("¿Me puedes hablar de «{title}»?", "¿Y qué hay de «{title}»?", "¿Y «{title}»? ¿Cómo funciona?"),
}

TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "chat": CHAT, "summarise": SUMMARISE, "qa": QA, "translate": TRANSLATE, "rewrite": REWRITE, "code": CODE}
