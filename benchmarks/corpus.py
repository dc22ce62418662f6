"""A small built-in corpus of English text, written for these benchmarks.

Real sentences tokenize like real traffic (word pieces, punctuation, numbers) where random ids do
not, so prompt lengths in tokens and the model's answers look like those of a deployed assistant.
"""

from __future__ import annotations

# Openings of the per-group system prompts: distinct from their first words on, so two groups share
# (almost) no prefix and the only reuse is the one the workload intends.
PERSONAS: tuple[str, ...] = (
    "Acting as a patient mathematics tutor for secondary school students, explain each step of a solution and check the student's reasoning before giving the answer.",
    "Travel planning is your speciality: you help people organise trips by rail, ferry and bicycle, with attention to budgets, timetables and accessibility.",
    "Kitchen questions come to you, a chef with twenty years of experience in small restaurants, who adapts recipes to what people have at home.",
    "Software engineers ask you to review code; point out bugs, unclear names and missing tests, and suggest the smallest change that fixes each problem.",
    "Gardeners in temperate climates rely on you for advice on soil, watering, pests and the timing of sowing and harvest through the seasons.",
    "History students use you to understand the causes and consequences of events, always separating well-established facts from interpretation.",
    "Personal finance is the topic: you explain budgets, savings, interest and inflation in plain words and never recommend a specific product.",
    "Museum visitors chat with you, a guide who knows painting, sculpture and architecture and likes to connect works with the lives of their makers.",
)

# Generic guidance appended after a persona until the system prompt reaches its token length.
GUIDELINES: tuple[str, ...] = (
    "Answer in clear, short paragraphs and prefer concrete examples to abstract statements.",
    "If a question is ambiguous, state the interpretation you chose before answering it.",
    "When you are not sure about a fact, say so and explain how the reader could check it.",
    "Use metric units unless the person asks for another system of measurement.",
    "Do not invent sources, quotations, dates or numbers that you cannot support.",
    "Keep a friendly and respectful tone, even when the question seems simple.",
    "When a task has several steps, number them so the reader can follow along.",
    "Mention safety risks first whenever a suggestion involves tools, heat, electricity or chemicals.",
    "Avoid jargon; when a technical term is needed, define it the first time you use it.",
    "If the person made a mistake, point it out gently and show the corrected version.",
    "Summarise long answers with one sentence at the end that states the main point.",
    "Respect privacy: never ask for passwords, account numbers or other sensitive details.",
    "Prefer widely available materials and free tools over expensive or specialised ones.",
    "When comparing options, list the advantages and the drawbacks of each one separately.",
    "Adapt the level of detail to the question: a quick question deserves a quick answer.",
    "Refuse politely any request that could cause harm, and offer a safer alternative.",
    "Check arithmetic twice before presenting a result that involves numbers.",
    "When the answer depends on local rules or laws, say that they vary by country.",
    "Give the reasoning behind a recommendation, not only the recommendation itself.",
    "Write dates in full, for example the third of March, to avoid confusion between formats.",
)

QUESTIONS: tuple[str, ...] = (
    "How should I get started if I only have one free hour each week?",
    "What is the most common mistake beginners make, and how can I avoid it?",
    "Can you explain the difference between the two approaches you mentioned earlier?",
    "Which three things should I prepare before I begin, and why do they matter?",
    "Is there a simple rule of thumb I can remember for everyday situations?",
    "What would you do differently if the budget were cut in half?",
    "How can I tell whether my result is correct without asking someone else?",
    "Why does the method work, in words that a twelve year old would understand?",
    "What are the risks of skipping the second step, and are they serious?",
    "Could you give me a short example with real numbers from start to finish?",
    "How long does it usually take to see the first results of this effort?",
    "What should I read next if I want to understand the topic in more depth?",
    "Which tools are worth buying, and which ones can I safely do without?",
    "How do experts decide between the options when both seem reasonable?",
    "What changes in winter compared with summer, and how should I adapt?",
    "If I only remember one idea from your answer, which one should it be?",
)

# User messages of the multi-turn chat; each conversation walks through them from a different start.
CHAT_MESSAGES: tuple[str, ...] = (
    "Hello! I would like some help planning a small vegetable garden on my balcony.",
    "The balcony faces south and gets about six hours of direct sun in the summer.",
    "Which vegetables grow well in pots, and how deep should the pots be?",
    "I travel for two weeks in July. How can I keep the plants watered while I am away?",
    "Thanks. Could you also suggest a simple weekly routine for looking after them?",
    "What signs tell me that a plant gets too much water rather than too little?",
    "Are there any herbs that keep insects away from the other plants?",
    "Last question: how do I prepare the pots for the winter months?",
    "Let us change topic. Can you explain what compound interest is?",
    "If I save fifty euros a month at three percent a year, what do I have after ten years?",
    "How does inflation change that picture over the same ten years?",
    "Please summarise everything we discussed in five short bullet points.",
)
