"""The real-model tier's toolsets (``AGENT_EXTRA_TOOLSETS``, tests/integration/real_model/conftest.py):
``weather``, one read-only tool a small model calls when asked, whose answer it cannot know
without calling it; ``plain``, no tool at all (a turn of text only)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from worker.tooling.contract import ToolResult, define_worker_tool
from worker.turn.context import TurnContext

FORECAST = "light rain, 13 degrees Celsius, wind from the west"
"""What ``get_weather`` answers for every city (the final answer should repeat some of it)."""


class City(BaseModel):
    city: str = Field(min_length=1, description="The city's name, for example London.")


def _forecast(params: City, ctx):
    return ToolResult(content={"city": params.city, "forecast": FORECAST})


def weather_tools(ctx: TurnContext):
    return [
        define_worker_tool(
            name="get_weather",
            description="Get today's weather forecast for a city.",
            input_model=City,
            execute=_forecast,
            is_read_only=True,
        )
    ]


def no_tools(ctx: TurnContext):
    return []
